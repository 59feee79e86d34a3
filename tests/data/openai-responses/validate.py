"""Validates OpenAI Responses API wire JSON against the `openai` SDK's own
types, with unknown fields refused: the request against the SDK's
`ResponseCreateParamsNonStreaming` (a TypedDict, every TypedDict of the
SDK's responses types closed to extra keys), the response against its
`Response` model (and no field the model does not declare, at any depth).

Reads {"requests": [...], "responses": [...]} on stdin; prints
{"sdk": version, "errors": [...]}: one line per request or response that
does not validate, saying which and why.
"""
import collections.abc
import importlib
import inspect
import json
import pkgutil
import sys
import typing

import openai
import openai.types.responses as types
import openai.types.shared_params as shared_params
import pydantic
import typing_extensions
from openai.types.responses import response_create_params

# Every TypedDict the SDK declares for these calls, in every module of its
# responses and shared types (a union's arms live in their own modules;
# typing_extensions' kind, which `typing.is_typeddict` does not see),
# refuses keys it does not declare.
MODULES = [response_create_params]
for package in (types, shared_params):
    MODULES.append(package)
    for info in pkgutil.iter_modules(package.__path__):
        MODULES.append(importlib.import_module(f"{package.__name__}.{info.name}"))
for module in MODULES:
    for _, kind in inspect.getmembers(module, inspect.isclass):
        if typing_extensions.is_typeddict(kind):
            kind.__pydantic_config__ = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)

PARAMS = response_create_params.ResponseCreateParamsNonStreaming
REQUEST = pydantic.TypeAdapter(PARAMS)
# pydantic checks an `Iterable` field's items only as they are iterated:
# each item of one (`input`, `tools`) is checked here as its own type.
ITEMS = {}
for field, hint in typing.get_type_hints(PARAMS).items():
    for arm in (hint, *typing.get_args(hint)):
        if typing.get_origin(arm) is collections.abc.Iterable:
            ITEMS[field] = pydantic.TypeAdapter(typing.get_args(arm)[0])


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
    try:
        REQUEST.validate_python(request)
        for field, items in ITEMS.items():
            value = request.get(field, [])
            if isinstance(value, list):
                for item in value:
                    items.validate_python(item)
    except pydantic.ValidationError as e:
        errors.append(f"request {i}: {e}")
for i, response in enumerate(given["responses"]):
    try:
        parsed = types.Response.model_validate(response)
    except pydantic.ValidationError as e:
        errors.append(f"response {i}: {e}")
        continue
    for field in undeclared(parsed):
        errors.append(f"response {i}: `{field}` is not a field of openai's Response")
print(json.dumps({"sdk": openai.__version__, "errors": errors}))
