"""How Ansible reaches a stack's nodes: the stack config's `gpupool:connection` section.

Connection settings (remote user, bastion, become, SSH arguments) are not part of the pool
description: the description says what the pool is, while these say how one operator's
control machine reaches it, which differs between stacks of one pool (from outside through
a bastion, or from the controller directly). They live beside the description's pointer in
`Pulumi.<stack>.yaml`, so they are input, never lost when an inventory is regenerated, and
both the generated inventory file and the `gpupool` inventory plugin carry them:

    config:
      gpupool:description: pools/prod.yaml
      gpupool:connection:
        all: {user: ops, become: true}
        sites:
          dc2: {bastion: ops@jump.dc2.example.com}

A site's settings are laid over the `all` settings field by field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gpupool.paths import PROJECT_ROOT
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError, Problem
from gpupool.spec.model import USER_RE, Description

CONFIG_KEY = "gpupool:connection"

_WORD_RE = re.compile(r"[^\s'\"]+")
# [user@]host[:port], comma-separated for several hops (as ssh -J takes them). Neither a
# user nor a host may start with '-': ssh would read it as an option of the jump's ssh.
_NAME = r"[A-Za-z0-9._][A-Za-z0-9._-]*"
_HOP = rf"({_NAME}@)?({_NAME}|\[[0-9A-Fa-f:.]+\])(:[0-9]{{1,5}})?"
_BASTION_RE = re.compile(rf"{_HOP}(,{_HOP})*")
_PATH_RE = re.compile(r"/[A-Za-z0-9._+/-]*")
# The ssh options a stack may add (ssh_config(5) keywords), as `-o Key=Value`: how to
# connect, never a command to run on this machine (ProxyCommand, LocalCommand,
# KnownHostsCommand, Match exec ...) nor a file of options to read (-F, Include). A cloned
# project's stack config is input like any other.
SSH_OPTIONS = frozenset({
    "addressfamily", "batchmode", "checkhostip", "ciphers", "compression",
    "connectionattempts", "connecttimeout", "controlmaster", "controlpath", "controlpersist",
    "forwardagent", "gssapiauthentication", "hostkeyalgorithms", "hostkeyalias",
    "identitiesonly", "identityagent", "identityfile", "kexalgorithms", "loglevel", "macs",
    "port", "preferredauthentications", "pubkeyacceptedalgorithms", "serveralivecountmax",
    "serveraliveinterval", "stricthostkeychecking", "tcpkeepalive", "user",
    "userknownhostsfile",
})
# StrictHostKeyChecking values that verify a host with a recorded key (accept-new records
# a key the first time only: a new node; a changed key is still refused).
UNSKIPPED_HOST_KEYS = frozenset({"yes", "accept-new"})
_SSH_OPTION_RE = re.compile(r"([A-Za-z]+)=([A-Za-z0-9@%._,:/+~-]+)")
# Ansible's become plugins that escalate on the target (ansible-doc -t become -l).
BECOME_METHODS = frozenset({"sudo", "su", "doas", "pbrun", "pfexec", "dzdo", "ksu",
                            "machinectl", "sesu", "runas"})


def _word(value: str) -> str:
    # Ansible splits these on blanks and quotes: a blank would start another argument.
    if not _WORD_RE.fullmatch(value):
        raise ValueError("must be one word, without blanks or quotes")
    return value


def _bastion(value: str) -> str:
    if not _BASTION_RE.fullmatch(value):
        raise ValueError("must be [user@]host[:port], several hops separated by ','")
    return value


def _user(value: str) -> str:
    if not re.fullmatch(USER_RE, value):
        raise ValueError("must be a Unix user name")
    return value


def _path(value: str) -> str:
    if not _PATH_RE.fullmatch(value) or "/../" in f"{value}/":
        raise ValueError("must be an absolute path of plain names")
    return value


def _become_method(value: str) -> str:
    if value not in BECOME_METHODS:
        raise ValueError(f"must be one of {', '.join(sorted(BECOME_METHODS))}")
    return value


def _ssh_args(value: str) -> str:
    """ssh_args as `-o Key=Value` options from SSH_OPTIONS, separated by blanks."""
    # "-o Key=Value" and "-oKey=Value" alike: join each lone -o to the word after it.
    options = re.sub(r"(^|\s)-o\s+(?=\S)", r"\1-o", value.strip()).split()
    for option in options:
        found = _SSH_OPTION_RE.fullmatch(option.removeprefix("-o"))
        if not option.startswith("-o") or not found:
            raise ValueError(f"{option!r} is not an ssh option written -o Key=Value")
        key, setting = found.group(1).lower(), found.group(2)
        if key not in SSH_OPTIONS:
            raise ValueError(f"ssh option {found.group(1)} is not one a stack may set "
                             "(it runs a command or reads other options)")
        # Host keys are verified on every connection: a host that is not the one recorded
        # is refused, never trusted (Ansible runs as root on what answers).
        if key == "stricthostkeychecking" and setting.lower() not in UNSKIPPED_HOST_KEYS:
            raise ValueError(f"StrictHostKeyChecking={setting} skips host key checks; "
                             f"use {' or '.join(sorted(UNSKIPPED_HOST_KEYS))}")
        if key in ("userknownhostsfile", "globalknownhostsfile") and \
                setting.lower() in ("/dev/null", "none"):
            raise ValueError(f"{found.group(1)}={setting} forgets every host key; name the "
                             "file of the pool's recorded host keys")
    return value


Word = Annotated[str, AfterValidator(_word)]
Bastion = Annotated[str, AfterValidator(_bastion)]
User = Annotated[str, AfterValidator(_user)]
AbsolutePath = Annotated[str, AfterValidator(_path)]
BecomeMethod = Annotated[str, AfterValidator(_become_method)]
SshArgs = Annotated[str, AfterValidator(_ssh_args)]

# Setting -> the Ansible connection variable it becomes (bastion and ssh_args together
# make ansible_ssh_common_args).
ANSIBLE_VARS = {
    "user": "ansible_user",
    "port": "ansible_port",
    "private_key_file": "ansible_ssh_private_key_file",
    "become": "ansible_become",
    "become_method": "ansible_become_method",
    "become_user": "ansible_become_user",
    "python_interpreter": "ansible_python_interpreter",
}


class Settings(BaseModel):
    """One level of settings; unset fields fall through to the level below."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: User | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    private_key_file: Word | None = None
    bastion: Bastion | None = None  # ProxyJump
    ssh_args: SshArgs | None = None  # more options for ssh, added after the bastion's
    become: bool | None = None
    become_method: BecomeMethod | None = None
    become_user: User | None = None
    python_interpreter: AbsolutePath | None = None

    def over(self, base: Settings) -> Settings:
        """These settings laid over base."""
        return base.model_copy(update=self.model_dump(exclude_none=True))

    def ansible_vars(self) -> dict[str, Any]:
        """The Ansible connection variables these settings set."""
        set_ = self.model_dump(exclude_none=True)
        found = {ANSIBLE_VARS[k]: v for k, v in set_.items() if k in ANSIBLE_VARS}
        ssh = ([f"-o ProxyJump={self.bastion}"] if self.bastion else []) + (
            [self.ssh_args] if self.ssh_args else [])
        if ssh:
            found["ansible_ssh_common_args"] = " ".join(ssh)
        return found


class Connection(BaseModel):
    """The whole section: settings for every host, and per site of the description."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    all: Settings = Settings()
    sites: dict[str, Settings] = {}

    def site_vars(self, site: str) -> dict[str, Any]:
        """The variables of the site's group: its settings over `all`'s, so that a site's
        bastion keeps `all`'s ssh_args (Ansible would replace the whole variable)."""
        return self.sites[site].over(self.all).ansible_vars() if site in self.sites else {}


def parse(data: Any, desc: Description, source: str) -> Connection:
    """Validate the section; raise DescriptionError naming every problem."""
    where = f"config.{CONFIG_KEY}"
    problems = [Problem(f"{where}.{p.path}" if p.path != "(top)" else where, p.rule,
                        p.message, p.value) for p in loader.control_characters(data)]
    try:
        conn = Connection.model_validate(data)
    except ValidationError as exc:
        problems += [Problem(f"{where}.{p.path}" if p.path != "(top)" else where, p.rule,
                             p.message, p.value)
                     for p in (loader._problem(e, Connection) for e in exc.errors())]
        raise DescriptionError(source, problems) from None
    problems += [Problem(f"{where}.sites.{s}", "site-exists",
                         f"no site {s} in the description (sites: {', '.join(desc.sites)})", s)
                 for s in conn.sites if s not in desc.sites]
    if problems:
        raise DescriptionError(source, problems)
    return conn


def for_stack(stack: str, desc: Description, root: Path = PROJECT_ROOT) -> Connection:
    """The stack's connection settings (none set when its config has no section)."""
    path = loader.stack_config_path(stack, root)
    cfg = loader.read_yaml(path)
    data = cfg["config"].get(CONFIG_KEY)  # description_path already checked the shape
    return Connection() if data is None else parse(data, desc, str(path))


def load(stack: str, root: Path = PROJECT_ROOT) -> tuple[Description, Connection]:
    """A stack's description and connection settings, both validated."""
    desc = loader.load_stack(stack, root)
    return desc, for_stack(stack, desc, root)
