"""Issue 50: the system accounts validation refuses as member names, read from real hosts."""

from __future__ import annotations

import pytest

from gpupool.lab import system_accounts
from gpupool.spec import loader
from gpupool.spec.catalog import SYSTEM_ACCOUNTS
from gpupool.spec.errors import DescriptionError
from tests.conftest import mutate, raw_stack


def test_only_the_systems_ids_are_read_and_gpupools_own_groups_left_out() -> None:
    table = ("root:x:0:0::/root:/bin/bash\nmysql:x:104:110::/nonexistent:/bin/false\n"
             "alice:x:20001:20001::/home/alice:/bin/bash\nnobody:x:65534:65534::/:/bin/false\n"
             "gpupool-admin:x:998:\nteam-vision:x:30001:\nbroken line\nx:x:notanumber:\n")
    assert system_accounts.parse(table) == {"root", "mysql", "nobody"}


@pytest.mark.parametrize("name", ["sudo", "adm", "mysql", "munge", "slurm", "prometheus",
                                  "nvpd", "systemd-journal"])
def test_a_member_named_as_a_system_account_is_refused(name: str) -> None:
    assert name in SYSTEM_ACCOUNTS
    with pytest.raises(DescriptionError) as info:
        loader.parse(mutate(raw_stack("lab"), [
            {"set": "teams.nlp.members.researcher", "value": ["erin", name]}]))
    assert {p.rule for p in info.value.problems} >= {"user-reserved"}
