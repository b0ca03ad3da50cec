"""The checked-in Serve configs (``deploy/serve-config.yaml``, the KubeRay RayService's ``serveConfigV2``)
are valid for Ray's own schema, agree with each other, and their ``args`` are ``omniwalk serve`` flags
that ``build_app`` accepts."""

from pathlib import Path

import yaml
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from omniwalk.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def serve_configs() -> dict[str, dict]:
    service = yaml.safe_load((DEPLOY / "rayservice.yaml").read_text())
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    return {
        "serve-config.yaml": yaml.safe_load((DEPLOY / "serve-config.yaml").read_text()),
        "rayservice.yaml": yaml.safe_load(service["spec"]["serveConfigV2"]),
    }


def test_the_serve_configs_pass_rays_schema_and_agree():
    configs = serve_configs()
    for name, config in configs.items():
        # (the schema ignores unknown keys: a misspelt one would pass it unread)
        assert set(config) <= set(ServeDeploySchema.model_fields), name
        assert set(config["applications"][0]) <= set(ServeApplicationSchema.model_fields), name
        schema = ServeDeploySchema.model_validate(config)
        (app,) = schema.applications
        assert app.import_path == "omniwalk.serve.ray.app:build_app", name
    assert configs["serve-config.yaml"] == configs["rayservice.yaml"]


def test_the_application_args_are_omniwalk_serve_flags():
    args = serve_configs()["serve-config.yaml"]["applications"][0]["args"]
    argv = ["serve"] + [item for name, value in args.items() for item in (f"--{name.replace('_', '-')}", str(value))]
    parsed = build_parser().parse_args(argv)
    assert parsed.ray_max_replicas == 4 and parsed.device == "cuda"
