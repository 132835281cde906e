"""`danube admin schemas ...`: the schema registry, as Danube's admin CLI has it.

    danube admin schemas register SUBJECT --schema-type avro --file user.avsc [--description D] [--tags T ...]
    danube admin schemas get --subject SUBJECT | --id ID [--version N]
    danube admin schemas versions SUBJECT
    danube admin schemas check SUBJECT --schema-type avro --file user-v2.avsc [--mode backward]
    danube admin schemas set-compatibility SUBJECT --mode full    (alias: compatibility)
    danube admin schemas get-compatibility SUBJECT
    danube admin schemas list-subjects
    danube admin schemas delete SUBJECT --version N --confirm
    danube admin schemas configure-topic /ns/topic --subject S [--policy enforce] [--payload-validation]
    danube admin schemas topic-config /ns/topic
    (the last two are aliases of Danube's `topics configure-schema` / `topics get-schema-config`)

The broker serves ``danube_schema.SchemaRegistry`` on the admin port (like Danube's admin CLI
expects) and on the client port.  Texts and JSON are Danube's CLI's (numbers as numbers, modes
upper case).  Exit codes: 0 done (``check``: compatible), 1 refused / not compatible /
unreachable, 2 bad usage.
"""

from __future__ import annotations

import getpass
import json
import sys

TYPES = ["avro", "json_schema", "protobuf", "string", "bytes", "number"]
MODES = ["none", "backward", "forward", "full"]


def add_parser(groups) -> None:
    """Adds the ``schemas`` group to ``danube admin``."""
    schemas = groups.add_parser("schemas", help="schema registry commands").add_subparsers(
        dest="admin_cmd", metavar="COMMAND"
    )
    p = schemas.add_parser("register", help="register a schema (an identical one returns its existing version)")
    p.add_argument("subject")
    p.add_argument("--schema-type", required=True, choices=TYPES)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--file", help="path to the schema definition")
    src.add_argument("--schema", help="inline schema definition")
    p.add_argument("--description", default="")
    p.add_argument("--tags", nargs="*", default=[])
    p = schemas.add_parser("get", help="a schema by subject (latest) or by id (and version)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--subject")
    which.add_argument("--id", type=int)
    p.add_argument("--version", type=int, help="with --id: that version (default: the latest)")
    p = schemas.add_parser("versions", help="versions of a subject")
    p.add_argument("subject")
    p = schemas.add_parser("check", help="is a schema compatible with the subject?")
    p.add_argument("subject")
    p.add_argument("--schema-type", required=True, choices=TYPES)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--file")
    src.add_argument("--schema")
    p.add_argument("--mode", choices=MODES, help="override the subject's compatibility mode")
    for name in ("compatibility", "set-compatibility"):
        p = schemas.add_parser(name, help="set a subject's compatibility mode")
        p.add_argument("subject")
        p.add_argument("--mode", required=True, choices=MODES)
    p = schemas.add_parser("get-compatibility", help="a subject's compatibility mode")
    p.add_argument("subject")
    schemas.add_parser("list-subjects", help="every registered subject with its latest version")
    p = schemas.add_parser("delete", help="delete one version of a subject")
    p.add_argument("subject")
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--confirm", action="store_true", help="required: deletion cannot be undone")
    p = schemas.add_parser("configure-topic", help="a topic's schema subject and validation policy")
    p.add_argument("topic")
    p.add_argument("--subject", required=True)
    p.add_argument("--policy", choices=["none", "warn", "enforce"], default="none")
    p.add_argument("--payload-validation", action="store_true", help="validate every payload against the schema")
    p = schemas.add_parser("topic-config", help="a topic's schema configuration")
    p.add_argument("topic")


def _definition(args) -> bytes | None:
    if getattr(args, "file", None):
        with open(args.file, "rb") as f:
            return f.read()
    if getattr(args, "schema", None) is not None:
        return args.schema.encode()
    if args.schema_type in ("string", "bytes", "number"):
        return b""
    print("danube admin schemas: give --file or --schema", file=sys.stderr)
    return None


def _pretty_definition(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            return json.dumps(json.loads(text), indent=2)
        except ValueError:
            pass
    return text


def run(args, channel, emit) -> int:
    """One ``schemas`` command over ``channel``; grpc.RpcError propagates to ``danube admin``."""
    from danube.proto.danube_schema import SchemaRegistry_pb2 as pb
    from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as pb_grpc

    stub = pb_grpc.SchemaRegistryStub(channel)
    t = args.timeout
    cmd = args.admin_cmd
    if cmd == "register":
        data = _definition(args)
        if data is None:
            return 2
        r = stub.RegisterSchema(
            pb.RegisterSchemaRequest(
                subject=args.subject,
                schema_type=args.schema_type,
                schema_definition=data,
                description=args.description,
                created_by=_user(),
                tags=args.tags,
            ),
            timeout=t,
        )
        emit(
            args,
            {
                "subject": args.subject,
                "schema_id": r.schema_id,
                "version": r.version,
                "is_new_version": r.is_new_version,
                "fingerprint": r.fingerprint,
            },
            [
                "✅ Registered new schema version" if r.is_new_version else "✅ Schema already exists",
                f"Subject: {args.subject}",
                f"Schema ID: {r.schema_id}",
                f"Version: {r.version}",
                f"Fingerprint: {r.fingerprint}",
            ],
        )
    elif cmd == "get":
        if args.id is not None:
            req = pb.GetSchemaRequest(schema_id=args.id)
            if args.version is not None:
                req.version = args.version
            r = stub.GetSchema(req, timeout=t)
        else:
            if args.version is not None:
                print("danube admin schemas: --version goes with --id", file=sys.stderr)
                return 2
            r = stub.GetLatestSchema(pb.GetLatestSchemaRequest(subject=args.subject), timeout=t)
        data = {
            "schema_id": r.schema_id,
            "version": r.version,
            "subject": r.subject,
            "schema_type": r.schema_type,
            "schema_definition": r.schema_definition.decode("utf-8", errors="replace"),
            "description": r.description,
            "created_at": r.created_at,
            "created_by": r.created_by,
            "tags": list(r.tags),
            "fingerprint": r.fingerprint,
            "compatibility_mode": r.compatibility_mode.upper(),
        }
        lines = [
            f"Schema ID: {r.schema_id}",
            f"Version: {r.version}",
            f"Subject: {r.subject}",
            f"Type: {r.schema_type}",
            f"Compatibility Mode: {r.compatibility_mode.upper()}",
        ]
        if r.description:
            lines.append(f"Description: {r.description}")
        if r.tags:
            lines.append(f"Tags: {', '.join(r.tags)}")
        lines += ["", "Schema Definition:", _pretty_definition(r.schema_definition)]
        emit(args, data, lines)
    elif cmd == "versions":
        r = stub.ListVersions(pb.ListVersionsRequest(subject=args.subject), timeout=t)
        data = [
            {
                "version": v.version,
                "schema_id": v.schema_id,
                "created_at": v.created_at,
                "created_by": v.created_by,
                "description": v.description,
                "fingerprint": v.fingerprint,
            }
            for v in r.versions
        ]
        lines = [f"Versions for subject '{args.subject}':"]
        for v in r.versions:
            lines.append(f"  Version {v.version}: schema_id={v.schema_id}, fingerprint={v.fingerprint}")
            if v.created_by:
                lines.append(f"    Created by: {v.created_by}")
            if v.description:
                lines.append(f"    Description: {v.description}")
        emit(args, data, lines)
    elif cmd == "check":
        data = _definition(args)
        if data is None:
            return 2
        req = pb.CheckCompatibilityRequest(
            subject=args.subject, new_schema_definition=data, schema_type=args.schema_type
        )
        if args.mode:
            req.compatibility_mode = args.mode
        r = stub.CheckCompatibility(req, timeout=t)
        lines = [
            f"✅ Schema is compatible with subject '{args.subject}'"
            if r.is_compatible
            else f"❌ Schema is NOT compatible with subject '{args.subject}'"
        ]
        if r.errors:
            lines += ["", "Compatibility errors:"] + [f"  - {e}" for e in r.errors]
        emit(args, {"subject": args.subject, "is_compatible": r.is_compatible, "errors": list(r.errors)}, lines)
        return 0 if r.is_compatible else 1
    elif cmd in ("compatibility", "set-compatibility"):
        r = stub.SetCompatibilityMode(
            pb.SetCompatibilityModeRequest(subject=args.subject, compatibility_mode=args.mode.upper()), timeout=t
        )
        return _outcome(
            args,
            emit,
            r,
            [f"✅ Compatibility mode set for subject '{args.subject}'", f"Mode: {args.mode.upper()}"],
            "❌ Failed to set compatibility mode",
        )
    elif cmd == "get-compatibility":
        # the registry has no call of its own for it: the latest version carries the subject's mode
        r = stub.GetLatestSchema(pb.GetLatestSchemaRequest(subject=args.subject), timeout=t)
        mode = r.compatibility_mode.upper()
        emit(
            args,
            {"subject": args.subject, "compatibility_mode": mode},
            [f"Subject: {args.subject}", f"Compatibility Mode: {mode}"],
        )
    elif cmd == "list-subjects":
        r = stub.ListSubjects(pb.ListSubjectsRequest(), timeout=t)
        data = [
            {
                "subject": x.subject,
                "schema_type": x.schema_type,
                "latest_version": x.latest_version,
                "schema_id": x.schema_id,
                "compatibility_mode": x.compatibility_mode,
                "tags": list(x.tags),
            }
            for x in r.subjects
        ]
        lines = [f"Found {len(data)} schema subject(s):", ""] if data else ["No schema subjects found."]
        for x in r.subjects:
            lines += [
                f"Subject: {x.subject}",
                f"  Type: {x.schema_type}",
                f"  Latest Version: {x.latest_version}",
                f"  Schema ID: {x.schema_id}",
                f"  Compatibility: {x.compatibility_mode}",
            ]
            lines += [f"  Tags: {', '.join(x.tags)}"] if x.tags else []
            lines.append("")
        emit(args, data, lines)
    elif cmd == "delete":
        if not args.confirm:
            print("danube admin schemas: deletion requires --confirm", file=sys.stderr)
            return 2
        r = stub.DeleteSchemaVersion(
            pb.DeleteSchemaVersionRequest(subject=args.subject, version=args.version), timeout=t
        )
        return _outcome(
            args,
            emit,
            r,
            [f"✅ Deleted version {args.version} of subject '{args.subject}'"],
            "❌ Failed to delete schema version",
        )
    elif cmd in ("configure-topic", "topic-config"):  # aliases of Danube's `topics` commands, same output
        from danube.cli import admin_topics

        if cmd == "configure-topic":
            args.admin_cmd, args.validation_policy = "configure-schema", args.policy
            args.enable_payload_validation = args.payload_validation
        else:
            args.admin_cmd = "get-schema-config"
        return admin_topics.schema_config(args, channel, emit, admin_topics.normalize_topic(args.topic, None))
    else:
        return 2
    return 0


def _outcome(args, emit, r, ok_lines, failed: str = "❌ Failed") -> int:
    emit(
        args,
        {"success": r.success, "message": r.message},
        ok_lines if r.success else [failed] + ([f"Error: {r.message}"] if r.message else []),
    )
    return 0 if r.success else 1


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return "admin"
