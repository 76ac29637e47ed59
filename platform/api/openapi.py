"""The OpenAPI 3.1 document for /api/v1/, kept beside the views it describes."""

from __future__ import annotations

from typing import Any

from api.openapi_metering import metering_paths, metering_schemas
from api.openapi_parts import errors as _errors, id_param as _id_param, json_response as _json
from api.openapi_parts import page_parameters, page_schema

def openapi_document() -> dict[str, Any]:
    from reports.api import openapi_paths as reports_openapi_paths

    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    return {
        "openapi": "3.1.0",
        "info": {"title": "Dyno API", "version": "1",
                 "description": "Upload models, run audited optimizations, read results. Every error, whatever "
                                "its status (404, 405, 413 and 500 included), is JSON: "
                                "{\"error\": {\"code\", \"message\"}}."},
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": {
            "/models": {
                "get": {"summary": "Your organization's models, newest first",
                        "parameters": page_parameters(),
                        "responses": {"200": _json(page_schema("models", ref("Model")), "models"),
                                      **_errors(400, 401)}},
                "post": {"summary": "Upload a model version (HF folder files, a config.json alone, or one zip)",
                         "requestBody": {"content": {"multipart/form-data": {"schema": {
                             "type": "object", "required": ["name", "files"],
                             "properties": {"name": {"type": "string"},
                                            "files": {"type": "array", "items": {"type": "string",
                                                                                 "format": "binary"}}}}}}},
                         "responses": {"201": _json(ref("ModelVersion"), "the new version"),
                                       **_errors(400, 401, 403, 413)}},
            },
            "/models/{model_id}": {"get": {"summary": "A model with its versions",
                                           "parameters": [_id_param("model_id")],
                                           "responses": {"200": _json(ref("Model"), "model"),
                                                         **_errors(401, 404)}}},
            "/model-versions/{version_id}": {"get": {"summary": "A model version with its files' hashes",
                                                     "parameters": [_id_param("version_id")],
                                                     "responses": {"200": _json(ref("ModelVersion"), "version"),
                                                                   **_errors(401, 404)}}},
            "/runs": {
                "get": {"summary": "Your organization's runs, newest first",
                        "parameters": page_parameters(),
                        "responses": {"200": _json(page_schema("runs", ref("Run")), "runs"), **_errors(400, 401)}},
                "post": {"summary": "Start a run of a model version on a hardware class",
                         "requestBody": {"content": {"application/json": {"schema": ref("RunRequest")}}},
                         "responses": {"201": _json(ref("Run"), "the queued run"),
                                       **_errors(400, 401, 403, 404, 413)}},
            },
            "/runs/{run_id}": {"get": {"summary": "A run's status, stage, progress, log and result",
                                       "parameters": [_id_param("run_id")],
                                       "responses": {"200": _json(ref("Run"), "run"), **_errors(401, 404)}}},
            "/runs/{run_id}/cancel": {"post": {"summary": "Cancel a queued or running run",
                                               "parameters": [_id_param("run_id")],
                                               "responses": {"200": _json(ref("Run"), "run"),
                                                             **_errors(401, 403, 404, 409)}}},
            "/audits": {"post": {
                "summary": "Audit a submitted candidate module for one suite workload (bring your own kernel)",
                "requestBody": {"content": {
                    "multipart/form-data": {"schema": {"type": "object", "required": ["workload", "candidate"],
                                                       "properties": {"workload": {"type": "string"},
                                                                      "hardware": {"type": "string", "default": "cpu"},
                                                                      "profile": {"type": "string", "default": "cpu-ci"},
                                                                      "candidate": {"type": "string", "format": "binary"}}}},
                    "application/json": {"schema": {"type": "object", "required": ["workload", "source"],
                                                    "properties": {"workload": {"type": "string"},
                                                                   "hardware": {"type": "string"},
                                                                   "profile": {"type": "string"},
                                                                   "source": {"type": "string"}}}}}},
                "responses": {"201": _json(ref("Run"), "the queued audit run"),
                              **_errors(400, 401, 403, 413)}}},
            "/audits/{run_id}": {"get": {"summary": "An audit's status, verdict and per-check result",
                                         "parameters": [_id_param("run_id")],
                                         "responses": {"200": _json(ref("Run"), "audit run"), **_errors(401, 404)}}},
            **reports_openapi_paths(),
            **metering_paths(),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "An organization API key: dyno_<prefix>_<secret>"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "Model": {"type": "object", "properties": {
                    "id": {"type": "string", "format": "uuid"}, "name": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "versions": {"type": "array", "items": ref("ModelVersion")}}},
                "ModelVersion": {"type": "object", "properties": {
                    "id": {"type": "string", "format": "uuid"}, "model": {"type": "string", "format": "uuid"},
                    "number": {"type": "integer"}, "kind": {"enum": ["weights", "card"]},
                    "family": {"type": "string"}, "architecture": {"type": "string"},
                    "parameter_count": {"type": "integer"}, "dtype": {"type": "string"},
                    "total_bytes": {"type": "integer"}, "created_at": {"type": "string", "format": "date-time"},
                    "files": {"type": "array", "items": {"type": "object", "properties": {
                        "path": {"type": "string"}, "size": {"type": "integer"},
                        "sha256": {"type": "string"}}}}}},
                "RunRequest": {"type": "object", "required": ["model_version", "hardware"], "properties": {
                    "model_version": {"type": "string", "format": "uuid"},
                    "hardware": {"type": "string", "examples": ["cpu", "gpu-h100", "gpu-h200"]},
                    "profile": {"enum": ["cpu-ci", "cpu", "gpu"], "default": "cpu-ci"},
                    "batch": {"type": "integer", "minimum": 1, "default": 1},
                    "seq": {"type": "integer", "minimum": 1, "default": 32}}},
                "Run": {"type": "object", "additionalProperties": False, "properties": {
                    "id": {"type": "string", "format": "uuid"},
                    "kind": {"enum": ["model", "audit"]},
                    "model_version": {"type": ["string", "null"], "format": "uuid"},
                    "workload": {"type": ["string", "null"], "description": "an audit's suite workload"},
                    "candidate_sha256": {"type": ["string", "null"]},
                    "verdict": {"type": ["string", "null"]},
                    "hardware": {"type": "string"}, "profile": {"type": "string"},
                    "batch": {"type": "integer"}, "seq": {"type": "integer"},
                    "status": {"enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
                    "stage": {"type": "string"}, "progress": {"type": "number", "minimum": 0, "maximum": 1},
                    "error": {"type": ["string", "null"]},
                    "created_at": {"type": "string", "format": "date-time"},
                    "started_at": {"type": ["string", "null"], "format": "date-time"},
                    "finished_at": {"type": ["string", "null"], "format": "date-time"},
                    "model": {"type": "object", "description": "the figure that bills",
                              "properties": {"speedup": {"type": ["number", "null"]},
                                             "ci95": {"type": "array", "items": {"type": ["number", "null"]}},
                                             "stable": {"type": ["boolean", "null"]}}},
                    "workloads": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "shape": {"type": "object"}, "dtype": {"type": "string"},
                        "verdict": {"type": "string"}, "speedup": {"type": ["number", "null"]},
                        "ci95": {"type": "array"}, "reasons": {"type": "array"}, "weight": {"type": ["number", "null"]}}}},
                    "inventory": {"type": "object", "description": "dyno.inventory/1: the model's workloads"},
                    "events": {"type": "array", "items": {"type": "object"}},
                    "links": {"type": "object"}}},
                **metering_schemas(),
            },
        },
    }
