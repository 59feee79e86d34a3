"""Validates Gemini wire JSON against Google's own types (google-genai's
pydantic models, which forbid unknown fields).

Reads {"requests": [...], "responses": [...]} on stdin; prints
{"sdk": version, "errors": [...]}: one line per request or response that
does not validate, saying which and why.
"""
import json
import sys

import google.genai as genai
from google.genai import types

# The generateContent request body: these fields, each of Google's type.
REQUEST_FIELDS = {
    "contents": lambda v: [types.Content.model_validate(c) for c in v],
    "systemInstruction": types.Content.model_validate,
    "generationConfig": types.GenerationConfig.model_validate,
    "safetySettings": lambda v: [types.SafetySetting.model_validate(s) for s in v],
    "tools": lambda v: [types.Tool.model_validate(t) for t in v],
    "toolConfig": types.ToolConfig.model_validate,
}

given = json.load(sys.stdin)
errors = []
for i, request in enumerate(given["requests"]):
    for field, value in request.items():
        check = REQUEST_FIELDS.get(field)
        if check is None:
            errors.append(f"request {i}: unknown field `{field}`")
            continue
        try:
            check(value)
        except Exception as e:  # a pydantic ValidationError, said as it is
            errors.append(f"request {i}: `{field}`: {e}")
for i, response in enumerate(given["responses"]):
    try:
        types.GenerateContentResponse.model_validate(response)
    except Exception as e:
        errors.append(f"response {i}: {e}")
print(json.dumps({"sdk": genai.__version__, "errors": errors}))
