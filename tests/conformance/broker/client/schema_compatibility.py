"""danube-broker/tests/schema_compatibility.rs: compatibility modes decide what a new version may change."""

import json

from danube import CompatibilityMode, SchemaType


def obj(props: dict, required: list) -> bytes:
    return json.dumps(
        {"type": "object", "properties": {n: {"type": t} for n, t in props.items()}, "required": required}
    ).encode()


async def register(schema, subject, data, schema_type=SchemaType.JSON_SCHEMA):
    return await schema.register_schema(subject).with_type(schema_type).with_schema_data(data).execute()


async def registers(schema, subject, data, schema_type=SchemaType.JSON_SCHEMA):
    """Danube's ``result.is_ok()``: whether the registration succeeded."""
    try:
        await register(schema, subject, data, schema_type)
        return True
    except Exception:  # noqa: BLE001 - the refusal is the observation
        return False


async def _evolve(ctx, subject, mode, v1, v2, schema_type=SchemaType.JSON_SCHEMA):
    client = await ctx.client()
    schema = client.schema()
    await register(schema, subject, v1, schema_type)
    await schema.set_compatibility_mode(subject, mode)
    return await registers(schema, subject, v2, schema_type)


async def test_backward_compatibility_add_optional_field(ctx):
    ok = await _evolve(
        ctx,
        "backward-add-field",
        CompatibilityMode.BACKWARD,
        obj({"name": "string"}, ["name"]),
        obj({"name": "string", "email": "string"}, ["name"]),
    )
    assert ok, "Adding optional field should be backward compatible"


async def test_backward_compatibility_remove_required_field_fails(ctx):
    ok = await _evolve(
        ctx,
        "backward-remove-field",
        CompatibilityMode.BACKWARD,
        obj({"name": "string", "age": "integer"}, ["name", "age"]),
        obj({"name": "string"}, ["name"]),
    )
    assert not ok, "Removing required field should fail backward compatibility"


async def test_forward_compatibility_remove_optional_field(ctx):
    ok = await _evolve(
        ctx,
        "forward-remove-field",
        CompatibilityMode.FORWARD,
        obj({"name": "string", "nickname": "string"}, ["name"]),
        obj({"name": "string"}, ["name"]),
    )
    assert ok, "Removing optional field should be forward compatible"


async def test_forward_compatibility_add_required_field_fails(ctx):
    ok = await _evolve(
        ctx,
        "forward-add-required",
        CompatibilityMode.FORWARD,
        obj({"name": "string"}, ["name"]),
        obj({"name": "string", "email": "string"}, ["name", "email"]),
    )
    assert not ok, "Adding required field should fail forward compatibility"


async def test_full_compatibility_strict_evolution(ctx):
    client = await ctx.client()
    schema = client.schema()
    subject = "full-compat"
    await register(schema, subject, obj({"id": "integer", "name": "string"}, ["id", "name"]))
    await schema.set_compatibility_mode(subject, CompatibilityMode.FULL)
    ok = await registers(
        schema, subject, obj({"id": "integer", "name": "string", "description": "string"}, ["id", "name"])
    )
    assert ok, "Adding optional field should pass FULL compatibility"
    ok = await registers(schema, subject, obj({"id": "integer"}, ["id"]))
    assert not ok, "Removing required field should fail FULL compatibility"


async def test_compatibility_none_allows_breaking_changes(ctx):
    ok = await _evolve(
        ctx, "none-compat", CompatibilityMode.NONE, obj({"name": "string"}, ["name"]), obj({"age": "integer"}, ["age"])
    )
    assert ok, "Breaking change should be allowed with NONE compatibility"


async def test_avro_backward_compatibility(ctx):
    v1 = json.dumps({"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}).encode()
    v2 = json.dumps(
        {
            "type": "record",
            "name": "User",
            "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": 0}],
        }
    ).encode()
    ok = await _evolve(ctx, "avro-backward", CompatibilityMode.BACKWARD, v1, v2, SchemaType.AVRO)
    assert ok, "Avro field with default should be backward compatible"


async def test_check_compatibility_before_registration(ctx):
    client = await ctx.client()
    schema = client.schema()
    subject = "compat-check"
    await register(schema, subject, obj({"id": "integer"}, ["id"]))
    await schema.set_compatibility_mode(subject, CompatibilityMode.BACKWARD)
    proposed = obj({"id": "integer", "name": "string"}, ["id"])
    is_compatible, errors = await schema.check_compatibility(subject, proposed, SchemaType.JSON_SCHEMA, None)
    assert is_compatible, f"Proposed schema should be compatible: {errors}"
    incompatible = obj({"name": "string"}, ["name"])
    is_compatible, _ = await schema.check_compatibility(subject, incompatible, SchemaType.JSON_SCHEMA, None)
    assert not is_compatible, "Incompatible schema should be rejected"


async def test_multiple_versions_evolution(ctx):
    client = await ctx.client()
    schema = client.schema()
    subject = "multi-version-test"
    await register(schema, subject, obj({"id": "integer"}, ["id"]))
    await schema.set_compatibility_mode(subject, CompatibilityMode.BACKWARD)
    await register(schema, subject, obj({"id": "integer", "name": "string"}, ["id"]))
    ok = await registers(schema, subject, obj({"id": "integer", "name": "string", "email": "string"}, ["id"]))
    assert ok, "V3 should be backward compatible with previous versions"
