"""`danube admin security`: roles, role bindings and tokens (docs/security.md).

    danube admin security roles list
    danube admin security roles create producer --permission produce:/default/* --permission lookup:/default/*
    danube admin security roles delete producer
    danube admin security bindings list
    danube admin security bindings create --subject alice --role producer [--role ...]
    danube admin security bindings delete --subject alice [--role producer]
    danube admin security tokens create --subject alice --secret-key-file secret.txt [--expires-in 30d]

``tokens create`` signs locally (HS256 with the broker's secret) and prints the token; the other
commands go to the broker's admin port (``danube_admin.SecurityAdmin``).  Against a secured broker
pass ``--tls-ca`` (and ``--tls-cert``/``--tls-key`` for mTLS) and ``--token`` (or
$DANUBE_ADMIN_TOKEN) to ``danube admin``; they apply to every admin command.
"""

from __future__ import annotations

import json
import os
import sys

SERVICE = "danube_admin.SecurityAdmin"


def add_connection_args(parser) -> None:
    """TLS and token options of ``danube admin`` (every group uses them)."""
    parser.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="CA of the broker's certificate: connect with TLS (default $DANUBE_ADMIN_TLS_CA)",
    )
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate (mTLS)")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="its private key")
    parser.add_argument(
        "--token", default=None, help="JWT sent as 'authorization: Bearer' (default $DANUBE_ADMIN_TOKEN; implies TLS)"
    )


def open_channel(args, target: str):
    """A grpc channel to the admin port: plain text, or TLS (+ client cert) with the token on every call."""
    import grpc

    ca = getattr(args, "tls_ca", None) or os.environ.get("DANUBE_ADMIN_TLS_CA")
    token = getattr(args, "token", None) or os.environ.get("DANUBE_ADMIN_TOKEN")
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if not (ca or token or cert):
        return grpc.insecure_channel(target)
    from danube.security.tls import channel_credentials

    creds = channel_credentials(ca, cert, key)
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(target, creds)


def register(groups) -> None:
    security = groups.add_parser("security", help="roles, role bindings and tokens").add_subparsers(
        dest="admin_cmd", metavar="COMMAND"
    )
    roles = security.add_parser("roles", help="roles: named sets of PERMISSION:PATTERN grants")
    roles_cmds = roles.add_subparsers(dest="security_cmd", metavar="ACTION")
    roles_cmds.add_parser("list", help="every role")
    p = roles_cmds.add_parser("create", help="create or replace a role")
    p.add_argument("name")
    p.add_argument(
        "--permission",
        "-p",
        action="append",
        required=True,
        metavar="PERMISSION:PATTERN",
        help="produce|consume|lookup|admin on a topic glob (/default/*), a namespace (/ns) or * (repeatable)",
    )
    p = roles_cmds.add_parser("delete", help="delete a role")
    p.add_argument("name")
    bindings = security.add_parser("bindings", help="which subjects hold which roles")
    bind_cmds = bindings.add_subparsers(dest="security_cmd", metavar="ACTION")
    bind_cmds.add_parser("list", help="every binding")
    p = bind_cmds.add_parser("create", help="give a subject roles (added to those it has)")
    p.add_argument("--subject", required=True, help="a JWT subject or a client certificate's common name")
    p.add_argument("--role", action="append", required=True, help="a role name (repeatable)")
    p = bind_cmds.add_parser("delete", help="take roles from a subject (all of them without --role)")
    p.add_argument("--subject", required=True)
    p.add_argument("--role", action="append", default=[])
    tokens = security.add_parser("tokens", help="JWTs for clients (signed here, nothing is sent)")
    token_cmds = tokens.add_subparsers(dest="security_cmd", metavar="ACTION")
    p = token_cmds.add_parser("create", help="print a signed HS256 token")
    p.add_argument("--subject", required=True, help="the token's sub claim: the principal RBAC sees")
    p.add_argument(
        "--secret-key",
        default=None,
        help="the broker's auth.jwt.secret_key (visible in ps: prefer --secret-key-file or $DANUBE_JWT_SECRET)",
    )
    p.add_argument("--secret-key-file", default=None, help="a file holding the secret key")
    p.add_argument("--issuer", default="danube-auth", help="iss claim [default danube-auth]")
    p.add_argument("--expires-in", default="1h", help="lifetime: 3600, 90s, 15m, 12h, 30d, 1y [default 1h]")


def run(args, channel, emit) -> int:
    cmd = getattr(args, "security_cmd", None)
    group = args.admin_cmd
    if cmd is None:
        print(f"danube admin security {group}: give an action (see --help)", file=sys.stderr)
        return 2

    def call(method: str, doc: dict) -> dict:
        stub = channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda d: json.dumps(d).encode(),
            response_deserializer=lambda b: json.loads(b.decode()) if b else {},
        )
        return stub(doc, timeout=args.timeout)

    if group == "roles":
        if cmd == "list":
            roles = call("ListRoles", {})["roles"]
            emit(roles, [f"{r['name']}: {', '.join(r['permissions'])}" for r in roles] or ["(no roles)"])
        elif cmd == "create":
            role = call("PutRole", {"name": args.name, "permissions": args.permission})
            emit(role, [f"Role {role['name']}: {', '.join(role['permissions'])}"])
        elif cmd == "delete":
            call("DeleteRole", {"name": args.name})
            emit({"deleted": args.name}, [f"Role {args.name} deleted"])
    elif group == "bindings":
        if cmd == "list":
            bindings = call("ListBindings", {})["bindings"]
            emit(bindings, [f"{b['subject']}: {', '.join(b['roles'])}" for b in bindings] or ["(no bindings)"])
        elif cmd == "create":
            binding = call("Bind", {"subject": args.subject, "roles": args.role})
            emit(binding, [f"{binding['subject']}: {', '.join(binding['roles'])}"])
        elif cmd == "delete":
            call("Unbind", {"subject": args.subject, "roles": args.role})
            emit(
                {"subject": args.subject, "removed": args.role or "all"},
                [f"{args.subject}: {', '.join(args.role) if args.role else 'all roles'} removed"],
            )
    return 0


def create_token(args, emit) -> int:
    from danube.errors import DanubeError
    from danube.security.jwt import issue_token, parse_duration
    from danube.security.settings import read_secret_file

    try:
        secret = args.secret_key or os.environ.get("DANUBE_JWT_SECRET")
        if args.secret_key_file:
            secret = read_secret_file(args.secret_key_file)
        if not secret:
            print(
                "danube admin security tokens create: give --secret-key-file, --secret-key or $DANUBE_JWT_SECRET",
                file=sys.stderr,
            )
            return 2
        lifetime = parse_duration(args.expires_in)
        token = issue_token(args.subject, secret, issuer=args.issuer or None, expires_in_s=lifetime)
    except DanubeError as exc:
        print(f"danube admin security tokens create: {exc}", file=sys.stderr)
        return 2
    emit({"token": token, "subject": args.subject, "expires_in_s": lifetime}, [token])
    return 0
