"""Run the Pulumi program without the Pulumi engine, recording what it declares.

The Pulumi CLI and provider plugins cannot be installed everywhere gpupool is checked,
so `gpupool plan`, `gpupool policy`, the tests and the benchmark run the real program
under pulumi.runtime.set_mocks. The mocks only echo inputs and invent ids and ARNs;
nothing here claims how AWS or Kubernetes would answer.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi.runtime.resource
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.proto import resource_pb2, source_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

PROJECT = "gpupool"
MOCK_AMI = "ami-0123456789abcdef0"
GET_AMI = "aws:ec2/getAmi:getAmi"  # the AMI lookup's invoke token
MOCK_ACCOUNT = "123456789012"  # the account the mocks answer as (AWS's documentation one)
GET_CALLER_IDENTITY = "aws:index/getCallerIdentity:getCallerIdentity"


@dataclass(frozen=True)
class Declared:
    """One registered resource: its engine type, name, parent and inputs."""

    urn: str
    type: str
    name: str
    parent: str | None  # parent URN; None for top-level resources
    custom: bool  # False for ComponentResources
    inputs: dict[str, Any]


@dataclass(frozen=True)
class Invoked:
    """One data source lookup (invoke): its token and arguments."""

    token: str
    args: dict[str, Any]


@dataclass
class Run:
    stack: str
    resources: list[Declared] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    invokes: list[Invoked] = field(default_factory=list)


def mock_image_ami(name: str) -> str:
    """The AMI id the mocks give an Image Builder image: stable per resource name."""
    return "ami-" + hashlib.sha256(name.encode()).hexdigest()[:17]


def plain(value: Any) -> Any:
    """Protobuf hands numbers back as floats; integral ones become ints again."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class _Mocks(pulumi.runtime.Mocks):
    """Echo inputs, fill the computed outputs the program reads (ids, ARNs, a built
    image's AMI), record lookups."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        state.setdefault("arn", f"arn:mock:{args.typ}:{args.name}")
        if args.typ == "aws:s3/bucket:Bucket":
            state["arn"] = f"arn:aws:s3:::{args.inputs.get('bucket', args.name)}"
        state.setdefault("name", args.inputs.get("name", args.name))
        state.setdefault("keyId", f"{args.name}-key-id")
        state.setdefault("prefixListId", f"pl-{args.name}")
        state.setdefault("dnsName", f"{args.name}.fsx.mock")
        if args.typ == "aws:imagebuilder/image:Image":
            state["outputResources"] = [{"amis": [{"image": mock_image_ami(args.name)}]}]
        if args.typ == "aws:ec2/vpnConnection:VpnConnection":
            # The tunnels' outside addresses (RFC 5737 documentation blocks).
            state.setdefault("tunnel1Address", "192.0.2.1")
            state.setdefault("tunnel2Address", "192.0.2.2")
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
        self.run.invokes.append(Invoked(args.token, plain(dict(args.args))))
        if args.token == GET_AMI:
            return {"id": MOCK_AMI, "imageId": MOCK_AMI, "name": "mock"}, []
        if args.token == GET_CALLER_IDENTITY:
            return {"id": MOCK_ACCOUNT, "accountId": MOCK_ACCOUNT, "userId": "mock",
                    "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/mock"}, []
        return {}, []


class _Monitor(pulumi_mocks.MockMonitor):
    """Sees each full registration request, with its parent and custom flag."""

    def __init__(self, mocks: _Mocks, run: Run) -> None:
        super().__init__(mocks)
        self.run = run

    def RegisterResource(self, request: Any) -> Any:
        """MockMonitor's, with the inputs deserialized once for both the mocks and the
        record (they were deserialized twice) and the state serialized without an event
        loop per resource: together about a tenth of a plan's CPU time."""
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        urn = self.make_urn(request.parent, request.type, request.name)
        _ensure_event_loop()  # as MockMonitor: resource references deserialize on a loop
        # Unknowns stay Unknown, as MockMonitor's own deserializing keeps them in a preview
        # (and run() always previews).
        inputs = rpc.deserialize_properties(request.object, keep_unknowns=True)
        id_, state = self.mocks.new_resource(pulumi.runtime.MockResourceArgs(
            typ=request.type, name=request.name, inputs=inputs, provider=request.provider,
            resource_id=request.importId, custom=request.custom or False,
            transforms=pulumi_mocks._resolve_callbacks(request.transforms)))
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        self.run.resources.append(Declared(
            urn, request.type, request.name, request.parent or None, bool(request.custom),
            plain(inputs)))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_,
                                                     object=_serialized(state))

    def RegisterResourceOutputs(self, request: Any) -> Any:
        if request.urn.split("::")[2] == "pulumi:pulumi:Stack":
            self.run.outputs = plain(rpc.deserialize_properties(request.outputs))
        return super().RegisterResourceOutputs(request)


def _serialized(state: dict[str, Any]) -> Any:
    """rpc.serialize_properties(state) without an event loop: over the plain values a mock's
    state holds the coroutine never waits, so one step finishes it. Should it wait, it is
    dropped (serializing changes nothing) and run again on a loop, as MockMonitor does."""
    coroutine = rpc.serialize_properties(state, {})
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    return _sync_await(rpc.serialize_properties(state, {}))


def run(program: Callable[[], None], stack: str, config: dict[str, str] | None = None) -> Run:
    """Run program as a preview of stack, in a context of its own (Pulumi's settings live
    in context variables, so runs do not leak into each other)."""
    return contextvars.copy_context().run(_run, program, stack, config or {})


@contextlib.contextmanager
def _without_source_positions() -> Iterator[None]:
    """Pulumi records where in the program each resource was declared, by extracting the
    whole Python stack (source lines included) for every one: about a fifth of a 1,000-node
    plan's CPU time, for a position nothing reads under mocks. Skip it during the run."""
    module = pulumi.runtime.resource
    original = getattr(module, "_get_stack_trace", None)
    if original is None:  # another SDK version: nothing to skip
        yield
        return
    module._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        module._get_stack_trace = original


def _run(program: Callable[[], None], stack: str, config: dict[str, str]) -> Run:
    result = Run(stack)
    mocks = _Mocks(result)
    settings.ROOT.set(None)
    pulumi.runtime.set_all_config(config)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=True,
                             monitor=_Monitor(mocks, result))
    # set_mocks finishes a root stack at once; ours must collect the program's exports.
    settings.ROOT.set(None)
    with _without_source_positions():
        _sync_await(run_pulumi_func(lambda: pulumi.runtime.stack.Stack(program)))
    result.resources.sort(key=lambda r: r.urn)
    return result
