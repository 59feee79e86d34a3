"""Validates Anthropic Messages wire JSON against the `anthropic` SDK's own
types, with unknown fields refused: the request against the SDK's
`MessageCreateParamsNonStreaming` (a TypedDict, every TypedDict of the SDK
closed to extra keys), the response against its `Message` model (and no
field the model does not declare, at any depth).

The SDK's 1.x types no longer declare the sampling parameters
(`temperature`, `top_p`, `top_k`): its migration guide ("removed deprecated
request parameters") sends them through `extra_body`, unchanged on the wire,
where the API still takes them for models with sampling options. They are
checked here as numbers and the rest against the SDK's types.

Reads {"requests": [...], "responses": [...]} on stdin; prints
{"sdk": version, "errors": [...]}: one line per request or response that
does not validate, saying which and why.
"""
import collections.abc
import inspect
import json
import sys
import typing

import anthropic
import anthropic.types as types
import pydantic
import typing_extensions
from anthropic.types import message_create_params

# Every TypedDict the SDK declares (typing_extensions' kind, which
# `typing.is_typeddict` does not see) refuses keys it does not declare.
for module in (types, message_create_params):
    for _, kind in inspect.getmembers(module, inspect.isclass):
        if typing_extensions.is_typeddict(kind):
            kind.__pydantic_config__ = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)

PARAMS = message_create_params.MessageCreateParamsNonStreaming
# Sent through `extra_body` with the 1.x SDK (see above).
EXTRA_BODY = ("temperature", "top_p", "top_k")
REQUEST = pydantic.TypeAdapter(PARAMS)
# pydantic checks an `Iterable` field's items only as they are iterated:
# each item of one (`messages`, `tools`) is checked here as its own type.
ITEMS = {
    field: pydantic.TypeAdapter(typing.get_args(hint)[0])
    for field, hint in typing.get_type_hints(PARAMS).items()
    if typing.get_origin(hint) is collections.abc.Iterable
}


def undeclared(model, at="response"):
    """The fields a parsed model holds that its type does not declare."""
    found = []
    if isinstance(model, pydantic.BaseModel):
        for key in (model.model_extra or {}):
            found.append(f"{at}.{key}")
        for key in type(model).model_fields:
            found.extend(undeclared(getattr(model, key), f"{at}.{key}"))
    elif isinstance(model, list):
        for i, item in enumerate(model):
            found.extend(undeclared(item, f"{at}[{i}]"))
    return found


given = json.load(sys.stdin)
errors = []
for i, request in enumerate(given["requests"]):
    request = dict(request)
    for name in EXTRA_BODY:
        value = request.pop(name, None)
        if value is not None and not isinstance(value, (int, float)):
            errors.append(f"request {i}: `{name}` is not a number")
    try:
        REQUEST.validate_python(request)
        for field, items in ITEMS.items():
            for j, item in enumerate(request.get(field, [])):
                items.validate_python(item)
    except pydantic.ValidationError as e:
        errors.append(f"request {i}: {e}")
for i, response in enumerate(given["responses"]):
    try:
        parsed = types.Message.model_validate(response)
    except pydantic.ValidationError as e:
        errors.append(f"response {i}: {e}")
        continue
    for field in undeclared(parsed):
        errors.append(f"response {i}: `{field}` is not a field of anthropic's Message")
print(json.dumps({"sdk": anthropic.__version__, "errors": errors}))
