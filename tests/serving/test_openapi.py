"""``/openapi.json`` and ``/docs``: a valid OpenAPI 3.1 document of every route, whose request schemas are the
handlers' own rules (the limits of the server that serves it), shown by a page that needs nothing from elsewhere.

The fuzzing of a live server against the document is ``test_openapi_fuzz.py``.
"""

from __future__ import annotations

import re

import jsonschema
import pytest
from aiohttp import hdrs
from aiohttp.test_utils import TestClient
from openapi_spec_validator import validate

from voxwire.serving.openapi import OPERATIONS

pytestmark = pytest.mark.asyncio


async def document(client: TestClient) -> dict:
    async with client.get("/openapi.json") as response:
        assert response.status == 200 and response.content_type == "application/json"
        return await response.json()


async def test_the_document_is_valid_openapi_3_1(client: TestClient) -> None:
    doc = await document(client)
    validate(doc)  # openapi-spec-validator: raises on any violation of the OpenAPI 3.1 schema
    assert doc["openapi"] == "3.1.0"


async def test_every_route_the_app_registers_is_documented(client: TestClient) -> None:
    """A new route cannot be forgotten: each (method, path) of the router is an operation of the document
    (aiohttp's automatic HEAD of a GET aside), and the document names no route the app lacks."""
    paths = (await document(client))["paths"]
    documented = {(method.upper(), path) for path, methods in paths.items() for method in methods}
    registered = {
        (route.method, route.resource.canonical)
        for route in client.server.app.router.routes()
        if route.resource is not None and route.method != hdrs.METH_HEAD
    }
    assert registered - documented == set(), "routes missing from /openapi.json (add them to openapi.OPERATIONS)"
    assert documented <= registered
    assert {"/v1/audio/speech", "/generate", "/openapi.json", "/docs", "/"} <= set(paths)
    assert len(documented) == len(OPERATIONS)  # the demo page is there in a checkout: every operation is listed


async def test_the_schemas_state_this_servers_limits_and_the_handlers_enforce_them(serve, aiohttp_client) -> None:
    # --strict-fields: the schema then closes the body (additionalProperties) and the handler refuses the same.
    client = await aiohttp_client(
        await serve(max_text_chars_per_utterance=12, max_inference_timesteps=12, strict_fields=True)
    )
    doc = await document(client)
    speech = doc["components"]["schemas"]["SpeechRequest"]
    assert speech["properties"]["input"]["maxLength"] == 12
    assert speech["properties"]["inference_timesteps"]["maximum"] == 12
    assert speech["additionalProperties"] is False
    generate = doc["components"]["schemas"]["GenerateRequest"]
    assert generate["properties"]["target_text"]["maxLength"] == 12 and "additionalProperties" not in generate

    # What the schema refuses the handler refuses, with the code the field declares; what it takes passes the
    # body checks (a 200 with audio here).
    cases = [
        ({"input": "x" * 13}, 400, "text_too_long"),
        ({"input": "   "}, 400, "empty_input"),
        ({"input": "Hi.", "inference_timesteps": 13}, 400, "invalid_parameter"),
        ({"input": "Hi.", "response_format": "ogg"}, 400, "unsupported_format"),
        ({"input": "Hi.", "tempo": 1}, 400, "unknown_field"),
        ({"input": "Hi.", "normalize": 0}, 400, "invalid_request"),
        ({"input": "Hi there.", "inference_timesteps": 12, "response_format": None, "seed": 1}, 200, None),
    ]
    validator = jsonschema.Draft202012Validator(speech)
    for body, status, code in cases:
        assert validator.is_valid(body) is (status == 200), body
        async with client.post("/v1/audio/speech", json=body) as response:
            assert response.status == status, (body, await response.text())
            if code is not None:
                assert (await response.json())["error"]["code"] == code
            else:
                assert response.content_type == "audio/mpeg" and len(await response.read()) > 0


async def test_the_nanovllm_routes_document_their_own_error_shape(client: TestClient) -> None:
    doc = await document(client)
    generate = doc["paths"]["/generate"]["post"]
    assert generate["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/GenerateRequest"
    }
    async with client.post("/generate", json={"max_generate_length": 0}) as response:
        body = await response.json()
    assert response.status == 422
    error_schema = {**generate["responses"]["422"]["content"]["application/json"]["schema"], **doc}
    jsonschema.validate(body, error_schema)
    assert {tuple(item["loc"]) for item in body["detail"]} == {("body", "target_text"), ("body", "max_generate_length")}


async def test_the_docs_page_is_served_from_the_package_and_reads_the_document(client: TestClient) -> None:
    async with client.get("/docs") as response:
        assert response.status == 200 and response.content_type == "text/html"
        page = await response.text()
    assert 'fetch("openapi.json")' in page
    # Nothing from another host: no CDN script, style or font.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page loads something from elsewhere"
    assert "<script src" not in page and "@import" not in page


async def test_the_document_and_the_page_need_no_api_key(serve, aiohttp_client) -> None:
    client = await aiohttp_client(await serve(api_keys=("k1",)))
    for path in ("/openapi.json", "/docs"):
        async with client.get(path) as response:
            assert response.status == 200, path
    async with client.get("/v1/voices") as response:
        assert response.status == 401
    doc = await document(client)
    assert doc["security"] == [{"bearer": []}, {"token": []}]
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "401" in doc["paths"]["/v1/voices"]["get"]["responses"]
