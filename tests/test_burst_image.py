"""The burst image: one EC2 Image Builder pipeline per burst region, whose image the launch
templates boot unless the stack config names one (mocks fixture: tests/_pulumi.py; the
mocks echo inputs, so this proves what is declared, not what Image Builder would build)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from gpupool.preview import plan, pulumi_mock
from gpupool.render import image, inventory
from gpupool.render.cloud import launch, names
from gpupool.spec import loader, os_release
from gpupool.spec.model import Description
from policies import offline
from tests._policy import unlisted
from tests._pulumi import declared, declared_mutated, of_type, one
from tests.conftest import ROOT, mutate, raw_stack

STACKS = ["lab", "example"]
OVERRIDE = "ami-0abcdef1234567890"
IB = "aws:imagebuilder/"
# The lab with a second burst region, its own hybrid link and group.
TWO_REGIONS = [
    {"set": "burst_groups.l4-london", "value": {
        "region": "eu-west-2", "availability_zones": ["eu-west-2a"],
        "instance_types": ["g6.xlarge"], "capacity": ["on-demand"], "min_nodes": 0,
        "max_nodes": 1}},
    {"set": "network.hybrid_links.eu-west-2", "value": {
        "vpn": {"customer_gateway": "198.51.100.10", "bgp_asn": 65010}}},
]


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest) -> str:
    return request.param


def _desc(stack: str) -> Description:
    return loader.load_stack(stack, ROOT)


def _with_config(desc: Description, stack: str, value: str) -> pulumi_mock.Run:
    return plan.declare(desc, stack, config={f"gpupool:{image.CONFIG_KEY}": value})


def _document(run: pulumi_mock.Run, desc: Description, region: str) -> dict[str, Any]:
    comp = one(run, "imagebuilder/component:Component", names.burst_image_name(desc, region))
    return yaml.safe_load(comp.inputs["data"])


def _steps(doc: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    found = next(p for p in doc["phases"] if p["name"] == phase)
    return {s["name"]: s for s in found["steps"]}


def test_one_pipeline_and_image_per_burst_region(stack: str) -> None:
    desc = _desc(stack)
    run = declared(stack)
    expected = sorted(names.burst_image_name(desc, r) for r in names.regions(desc))
    for kind in ("component:Component", "imageRecipe:ImageRecipe",
                 "infrastructureConfiguration:InfrastructureConfiguration",
                 "distributionConfiguration:DistributionConfiguration",
                 "imagePipeline:ImagePipeline", "image:Image"):
        assert sorted(r.name for r in of_type(run, f"{IB}{kind}")) == expected, kind
    assert set(run.outputs["image_pipelines"]) == set(names.regions(desc))


def test_two_burst_regions_get_two_pipelines() -> None:
    run = declared_mutated("lab", TWO_REGIONS)
    pipelines = sorted(r.name for r in of_type(run, ":ImagePipeline"))
    assert pipelines == ["lab-eu-west-1-burst-image", "lab-eu-west-2-burst-image"]
    templates = {r.name: r.inputs["imageId"] for r in of_type(run, ":LaunchTemplate")}
    assert templates == {"lab-l4-burst": pulumi_mock.mock_image_ami(pipelines[0]),
                         "lab-l4-london": pulumi_mock.mock_image_ami(pipelines[1])}


def test_the_recipe_builds_on_debians_official_ami_of_the_burst_release(stack: str) -> None:
    """Debian's AMIs of the release burst nodes run (the controllers': Debian 13 for the
    example, whose Slurm only Debian 13 carries; Debian 12 for the lab)."""
    desc = _desc(stack)
    number = os_release.burst_release(desc).value.removeprefix("debian-")
    run = declared(stack)
    lookups = [c.args for c in run.invokes if c.token == pulumi_mock.GET_AMI]
    assert lookups and all(a["owners"] == ["136693071363"] for a in lookups)
    assert all({"name": "name", "values": [f"debian-{number}-amd64-*"]} in a["filters"]
               for a in lookups)
    for region in names.regions(desc):
        recipe = one(run, ":ImageRecipe", names.burst_image_name(desc, region)).inputs
        assert recipe["parentImage"] == pulumi_mock.MOCK_AMI
        assert recipe["components"] == [{"componentArn": "arn:mock:aws:imagebuilder/"
                                         "component:Component:"
                                         + names.burst_image_name(desc, region)}]


def test_the_document_runs_the_image_playbook_locally_at_the_lock(stack: str) -> None:
    desc = _desc(stack)
    for region in names.regions(desc):
        doc = _document(declared(stack), desc, region)
        build = _steps(doc, "build")
        assert list(build) == ["InstallAnsible", "FetchPlaybooks", "VerifyArtifact",
                               "WriteVars", "RunPlaybook", "CleanUp"]
        assert "apt-get install -y -q --no-install-recommends ansible" in \
            build["InstallAnsible"]["inputs"]["commands"]
        [fetch] = build["FetchPlaybooks"]["inputs"]
        assert fetch["source"] == f"s3://{names.bucket_name(desc, 'datasets')}/" \
                                  f"{image.ARTIFACT_KEY}"
        run_cmd = " ".join(build["RunPlaybook"]["inputs"]["commands"])
        assert "ansible-playbook -c local -i localhost," in run_cmd
        assert run_cmd.endswith(" playbooks/burst_image.yml")
        [written] = build["WriteVars"]["inputs"]
        assert f"-e @{written['path']}" in run_cmd
        image_vars = json.loads(written["content"])
        assert image_vars == inventory.burst_image_vars(desc, region)
        locked = os_release.lock(desc, os_release.burst_release(desc))
        assert image_vars["gpupool_software"] == locked
        # Every locked version is written in the document itself (YAML folds its long
        # lines at any space: compared with the folds undone).
        data = " ".join(one(declared(stack), ":Component", names.burst_image_name(desc, region)
                            ).inputs["data"].split())
        for component, version in locked.items():
            if component != "blocklist":
                assert f'"{component}": "{version}"' in data, component
        # The build's Ansible leaves the image: a booted node runs none.
        assert "apt-get purge -y -q ansible ansible-core" in build["CleanUp"]["inputs"]["commands"]
        checks = " ".join(_steps(doc, "validate")["BurstBootNeeds"]["inputs"]["commands"])
        assert locked["slurm"] in checks and launch.SPOT_WATCH_PROGRAM in checks


def test_a_lock_change_is_a_new_component_and_recipe_version() -> None:
    desc = _desc("lab")
    name = names.burst_image_name(desc, "eu-west-1")
    base = declared("lab")
    moved = declared_mutated("lab", [{"set": "software.slurm", "value": "22.05.9"}])
    for kind in (":Component", ":ImageRecipe"):
        before, after = (one(r, kind, name).inputs["version"] for r in (base, moved))
        assert before != after, kind
        for v in (before, after):
            fields = [int(f) for f in v.split(".")]
            assert len(fields) == 3 and all(0 <= f < 2**30 for f in fields), v
    # Deterministic: the same description gives the same versions.
    again = plan.declare(desc, "lab")
    assert one(again, ":ImageRecipe", name).inputs["version"] == \
        one(base, ":ImageRecipe", name).inputs["version"]
    doc = image.component_document(desc, "eu-west-1", None)
    assert one(base, ":Component", name).inputs["version"] == image.version(doc)


def test_launch_templates_boot_their_regions_built_image(stack: str) -> None:
    desc = _desc(stack)
    run = declared(stack)
    for group, g in desc.burst_groups.items():
        lt = one(run, ":LaunchTemplate", names.burst_name(desc, group)).inputs
        name = names.burst_image_name(desc, g.region)
        assert lt["imageId"] == pulumi_mock.mock_image_ami(name)
        assert lt["tags"][names.TAG_BURST_IMAGE] == name
        assert all(t["tags"][names.TAG_BURST_IMAGE] == name for t in lt["tagSpecifications"])
        assert lt["blockDeviceMappings"][0]["deviceName"] == launch.ROOT_DEVICE
    assert run.outputs["burst_images"] == {
        r: pulumi_mock.mock_image_ami(names.burst_image_name(desc, r))
        for r in names.regions(desc)}


def test_the_stack_config_names_a_prebuilt_image(stack: str) -> None:
    desc = _desc(stack)
    run = _with_config(desc, stack, OVERRIDE)
    assert of_type(run, f"{IB}image:Image") == []
    assert len(of_type(run, ":ImagePipeline")) == len(names.regions(desc))  # still declared
    for group in desc.burst_groups:
        lt = one(run, ":LaunchTemplate", names.burst_name(desc, group)).inputs
        assert lt["imageId"] == OVERRIDE
        assert lt["tags"][names.TAG_BURST_IMAGE] == names.IMAGE_FROM_CONFIG
    assert run.outputs["burst_images"] == dict.fromkeys(names.regions(desc), OVERRIDE)
    config = {f"gpupool:{image.CONFIG_KEY}": (OVERRIDE, False)}
    assert unlisted(offline.check(run, desc, config)) == []


def test_a_per_region_map_overrides_only_its_regions() -> None:
    desc = loader.parse(mutate(raw_stack("lab"), TWO_REGIONS))
    run = _with_config(desc, "lab", json.dumps({"eu-west-2": OVERRIDE}))
    assert [r.name for r in of_type(run, f"{IB}image:Image")] == ["lab-eu-west-1-burst-image"]
    templates = {r.name: r.inputs["imageId"] for r in of_type(run, ":LaunchTemplate")}
    assert templates == {
        "lab-l4-burst": pulumi_mock.mock_image_ami("lab-eu-west-1-burst-image"),
        "lab-l4-london": OVERRIDE}


@pytest.mark.parametrize(("value", "message"), [
    ("ami-nothex", "'ami-nothex' is not an AMI id"),
    ('{"eu-north-1": "ami-0abcdef1234567890"}', "names 'eu-north-1', where the pool does not"),
    ("{not json", "is not a JSON object"),
    ('["ami-0abcdef1234567890"]', "is not an AMI id"),
])
def test_a_bad_config_value_is_refused_with_a_message(value: str, message: str) -> None:
    with pytest.raises(plan.PlanError, match=message.replace("(", r"\(")):
        _with_config(_desc("lab"), "lab", value)


def test_one_ami_for_several_regions_is_refused() -> None:
    desc = loader.parse(mutate(raw_stack("lab"), TWO_REGIONS))
    with pytest.raises(plan.PlanError, match="names one AMI, but the pool bursts in "
                                             "eu-west-1, eu-west-2"):
        _with_config(desc, "lab", OVERRIDE)


DIGEST = hashlib.sha256(b"the artifact").hexdigest()


def _verify_script(desc: Description, digest: str | None, archive: Path) -> str:
    """The rendered VerifyArtifact step of the region's component, as one bash script
    (Image Builder's ExecuteBash), aimed at archive instead of the build's path."""
    run = plan.declare(desc, "lab", config={f"gpupool:{image.DIGEST_KEY}": digest or ""})
    doc = _document(run, desc, names.regions(desc)[0])
    step = _steps(doc, "build")["VerifyArtifact"]
    assert step["action"] == "ExecuteBash"
    script = "\n".join(step["inputs"]["commands"])
    # The file checked is the file downloaded.
    assert digest is None or script.count(image.ARCHIVE) >= 2
    return script.replace(image.ARCHIVE, str(archive))


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)


def test_the_build_verifies_the_artifact_against_the_pinned_digest(tmp_path: Path) -> None:
    archive = tmp_path / "gpupool-image.tar.gz"
    archive.write_bytes(b"the artifact")
    script = _verify_script(_desc("lab"), DIGEST, archive)
    ok = _bash(script)
    assert ok.returncode == 0, ok.stderr
    assert archive.read_bytes() == b"the artifact"
    # One byte changed: the build step fails, says why, and leaves nothing to extract.
    archive.write_bytes(b"the artifacT")
    changed = _bash(script)
    assert changed.returncode != 0
    assert f"is not the one pinned by gpupool:{image.DIGEST_KEY} ({DIGEST})" in changed.stderr
    assert not archive.exists()
    # A missing download fails too.
    assert _bash(script).returncode != 0
    # Unpinned, every artifact fails the build.
    archive.write_bytes(b"the artifact")
    unpinned = _bash(_verify_script(_desc("lab"), None, archive))
    assert unpinned.returncode != 0
    assert f"set the stack config gpupool:{image.DIGEST_KEY}" in unpinned.stderr


def test_the_pin_is_in_the_declared_component_and_versions_it() -> None:
    desc = _desc("lab")
    name = names.burst_image_name(desc, "eu-west-1")
    pinned = plan.declare(desc, "lab", config={f"gpupool:{image.DIGEST_KEY}": DIGEST})
    other = plan.declare(desc, "lab", config={f"gpupool:{image.DIGEST_KEY}": "0" * 64})
    comp = one(pinned, ":Component", name).inputs
    verify = _steps(yaml.safe_load(comp["data"]), "build")["VerifyArtifact"]
    assert any(DIGEST in c and "sha256sum --check --strict" in c
               for c in verify["inputs"]["commands"])
    assert comp["version"] == image.version(image.component_document(desc, "eu-west-1", DIGEST))
    # A new artifact is a new component version, and so a new recipe (versions are
    # immutable in Image Builder).
    for kind in (":Component", ":ImageRecipe"):
        assert one(pinned, kind, name).inputs["version"] != \
            one(other, kind, name).inputs["version"], kind
    assert unlisted(offline.check(pinned, desc)) == []


@pytest.mark.parametrize("value", [
    DIGEST.upper(), DIGEST[:63], DIGEST + "0", f" {DIGEST}", f"{DIGEST}\n", "sha256:" + DIGEST,
    "g" * 64, "x" * 500, f"{DIGEST}  gpupool-image.tar.gz"])
def test_a_malformed_digest_is_refused_with_a_message(value: str) -> None:
    with pytest.raises(plan.PlanError, match=f"gpupool:{image.DIGEST_KEY} must be the "
                                             "artifact's SHA-256 as exactly 64 lowercase hex"):
        plan.declare(_desc("lab"), "lab", config={f"gpupool:{image.DIGEST_KEY}": value})
    with pytest.raises(ValueError, match="not a SHA-256"):
        image.verify_commands(value)


def test_the_build_runs_with_imdsv2_encrypted_and_terminates_on_failure(stack: str) -> None:
    desc = _desc(stack)
    run = declared(stack)
    for region in names.regions(desc):
        name = names.burst_image_name(desc, region)
        infra = one(run, ":InfrastructureConfiguration", name).inputs
        assert infra["instanceMetadataOptions"] == {"httpTokens": "required",
                                                    "httpPutResponseHopLimit": 1}
        assert infra["terminateInstanceOnFailure"] is True
        zone = names.region_zones(desc, region)[0]
        assert infra["subnetId"] == f"{desc.pool.name}-{region}-training-{zone}-id"
        assert infra["securityGroupIds"] == [f"{desc.pool.name}-{region}-{s}-id"
                                             for s in ("training", "management")]
        assert infra["instanceProfileName"] == f"{name}-builder"
        assert infra["instanceTypes"] == image.instance_types(desc, region)
        [root] = one(run, ":ImageRecipe", name).inputs["blockDeviceMappings"]
        assert root["deviceName"] == launch.ROOT_DEVICE
        assert root["ebs"]["encrypted"] == "true"
        pipeline = one(run, ":ImagePipeline", name).inputs
        assert "schedule" not in pipeline  # on demand only
        [dist] = one(run, ":DistributionConfiguration", name).inputs["distributions"]
        assert dist["region"] == region
        ami = dist["amiDistributionConfiguration"]
        assert ami["name"] == f"{name}-{{{{ imagebuilder:buildDate }}}}"
        assert ami["amiTags"] == names.tags(desc, None, **{names.TAG_BURST_REGION: region})


def test_the_builder_profile_is_least_privilege(stack: str) -> None:
    desc = _desc(stack)
    run = declared(stack)
    for region in names.regions(desc):
        name = f"{names.burst_image_name(desc, region)}-builder"
        attached = sorted(r.inputs["policyArn"] for r in of_type(run, ":RolePolicyAttachment")
                          if r.inputs["role"] == name)
        assert attached == sorted([
            "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
            "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
            f"arn:mock:aws:iam/policy:Policy:{name}"])
        doc = json.loads(one(run, "iam/policy:Policy", name).inputs["policy"])
        assert [(s["Action"], s["Resource"]) for s in doc["Statement"]] == [
            (["s3:GetObject"], [f"arn:aws:s3:::{names.bucket_name(desc, 'datasets')}/"
                                f"{image.ARTIFACT_KEY}"]),
            (["kms:Decrypt"], [f"arn:mock:aws:kms/key:Key:{desc.pool.name}-key"])]


def test_every_image_resource_carries_the_pool_and_region_tags(stack: str) -> None:
    desc = _desc(stack)
    found = [r for r in declared(stack).resources if r.type.startswith(IB)]
    assert found
    for r in found:
        region = r.inputs["tags"][names.TAG_BURST_REGION]
        assert r.inputs["tags"] == names.tags(desc, None, **{names.TAG_BURST_REGION: region})
        if r.type.endswith(":InfrastructureConfiguration"):
            assert r.inputs["resourceTags"] == r.inputs["tags"]  # the build instance's


def test_the_spot_watcher_path_is_the_slurm_roles() -> None:
    defaults = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    assert defaults["slurm_spot_watch_program"] == launch.SPOT_WATCH_PROGRAM


def test_the_artifact_holds_what_the_playbook_reads() -> None:
    assert (ROOT / image.PLAYBOOK).is_file()
    for path in image.ARTIFACT_PATHS:
        assert (ROOT / path).exists(), path
    play = yaml.safe_load((ROOT / image.PLAYBOOK).read_text())
    roles = [r["role"] for p in play for r in p.get("roles", [])]
    included = [t["ansible.builtin.include_role"]["name"] for p in play
                for t in p.get("tasks", []) if "ansible.builtin.include_role" in t]
    assert roles + included == ["common", "hardening", "node_exporter", "storage",
                                 "acceptance_gate", "slurm"]
    # The playbook finds the archive where the artifact puts it, beside the playbooks'
    # folder (one archive, for the image's release's Python).
    gate = next(r["vars"] for p in play for r in p.get("roles", [])
                if r["role"] == "acceptance_gate")
    bundle = jinja2.Environment(autoescape=False).from_string(  # noqa: S701 a path, not HTML
        gate["acceptance_gate_bundle"])
    assert bundle.render(playbook_dir="/a/playbooks") == "/a/playbooks/../" + image.GATE_BUNDLE


def test_the_image_vars_define_what_the_roles_argument_specs_read(stack: str) -> None:
    """Ansible resolves a role's argument-spec defaults even where the play sets the
    option, so every gpupool_* variable they read must be among the image's variables (the
    image build failed on gpupool_flow_sources and gpupool_health before they were)."""
    desc = _desc(stack)
    play = yaml.safe_load((ROOT / image.PLAYBOOK).read_text())
    roles = [r["role"] for p in play for r in p.get("roles", [])]
    for region in names.regions(desc):
        defined = set(inventory.burst_image_vars(desc, region))
        for role in roles:
            specs = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml")
                                   .read_text())["argument_specs"]
            for entry in specs.values():
                for option, spec in entry.get("options", {}).items():
                    default = str(spec.get("default", ""))
                    # Unless the expression guards it somewhere (`is defined`, or
                    # `| default(...)` right after it): Jinja reads it only behind that.
                    guarded = set(re.findall(r"\b(gpupool_[a-z_]+) (?:is defined|\| default)",
                                             default))
                    needed = set(re.findall(r"\bgpupool_[a-z_]+\b", default)) - guarded
                    assert needed <= defined, (role, option, needed - defined)
