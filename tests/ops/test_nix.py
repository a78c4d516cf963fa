"""The NixOS module (``nix/module.nix``), the package and the flake, evaluated with ``nix-instantiate``.

Every ``.nix`` file must parse. The module is evaluated through ``lib.evalModules``
with stand-ins for the NixOS options it defines into (``tests/ops/nix/nixos-stubs.nix``)
and for ``pkgs`` (``tests/ops/nix/pkgs.nix``), and the unit it generates is compared
with ``systemd/hamsterbunker@.service`` key by key. The nixpkgs ``lib`` is the
minimal one of ``tests/ops/nix/minimal-lib.nix``, and also the real one when
``HB_NIXPKGS_LIB`` names a checked-out ``lib`` directory (of nixpkgs, or of
nix-community/nixpkgs.lib). Evaluation uses no Nix store at all (``--store
dummy://``), so copying anything into one fails. Without ``nix-instantiate`` the
tests are skipped, or fail when CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.http_address import parse_http_address
from hamsterbunker.ops.config import _TYPES, DEFAULT_CONFIG_DIR, parse_config

ROOT = Path(__file__).resolve().parents[2]
NIX_TESTS = Path(__file__).parent / "nix"
UNIT = ROOT / "systemd" / "hamsterbunker@.service"
SYSUSERS = ROOT / "systemd" / "hamsterbunker.sysusers"
PYPROJECT = ROOT / "pyproject.toml"
INSTALLED_HB = "/opt/hamsterbunker/bin/hb"
TIMEOUT = 120
# Evaluate without a Nix store: nothing may be copied into one (a secret given as a
# path literal, say), and the tests need neither a daemon nor a writable /nix.
NIX_OPTIONS = ["--store", "dummy://", "--read-write-mode"]

SUMMARISER = """
{
  services.hamsterbunker.agents.summariser = {
    enable = true;
    localOnly = true;
    settings = {
      agent = "mypkg.agents:Summariser";
      region = "eu-central";
    };
  };
}
"""


# -- running nix-instantiate ------------------------------------------------------------


@pytest.fixture(scope="session")
def nix_instantiate() -> str:
    path = shutil.which("nix-instantiate")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "nix-instantiate is not installed, and CI=true requires it (apt-get install nix-bin)"
            )
        pytest.skip(
            "nix-instantiate is not installed (apt-get install nix-bin to run these checks)"
        )
    return path


def _real_lib() -> str | None:
    """The nixpkgs lib directory HB_NIXPKGS_LIB names (a nixpkgs.lib checkout's root will do)."""
    given = os.environ.get("HB_NIXPKGS_LIB", "")
    if not given:
        return None
    path = Path(given).resolve()
    if not (path / "modules.nix").is_file() and (path / "lib" / "modules.nix").is_file():
        path = path / "lib"
    return str(path)


LIBS = [pytest.param("", id="minimal-lib")]
if _real_lib() is not None:
    LIBS.append(pytest.param(_real_lib(), id="nixpkgs-lib"))


@pytest.fixture(params=LIBS, scope="module")
def lib_path(request: pytest.FixtureRequest) -> str:
    """'' for tests/ops/nix/minimal-lib.nix, else the path of the real nixpkgs lib."""
    path: str = request.param
    if path and not (Path(path) / "modules.nix").is_file():
        pytest.fail(
            f"HB_NIXPKGS_LIB={os.environ['HB_NIXPKGS_LIB']} holds no nixpkgs lib (modules.nix)"
        )
    return path


def requirement_name(requirement: str) -> str:
    """'tomli-w>=1.0' -> 'tomli-w' (nixpkgs' python3Packages use the same, lower-case names)."""
    return re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0].lower()


# pyproject.toml's extras that nix/package.nix includes (its with* arguments); `test` and `bench`
# are the developers'; an agent that uses an integration brings its framework (AGENT_EXTRAS).
PACKAGED_EXTRAS = ("tui", "redis", "etcd", "postgres")
AGENT_EXTRAS = ("pydantic-ai", "langgraph")


def python_package_names() -> list[str]:
    """The python3Packages attributes nix/package.nix may use: pyproject's requirements."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    required = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    for extra in PACKAGED_EXTRAS:
        required += project["project"]["optional-dependencies"][extra]
    return sorted({requirement_name(r) for r in required})


def instantiate(nix: str, args: list[str], *, expect_failure: bool = False) -> Any:
    result = subprocess.run(
        [nix, *NIX_OPTIONS, "--eval", "--strict", "--json", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if expect_failure:
        assert result.returncode != 0, result.stdout
        return result.stderr
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def evaluate(nix: str, lib: str, host: str, directory: Path) -> dict[str, Any]:
    """tests/ops/nix/eval.nix for the host module `host` (Nix text)."""
    directory.mkdir(parents=True, exist_ok=True)
    host_file = directory / "host.nix"
    host_file.write_text(host, encoding="utf-8")
    return instantiate(  # type: ignore[no-any-return]
        nix,
        [
            str(NIX_TESTS / "eval.nix"),
            "--arg",
            "host",
            str(host_file),
            "--argstr",
            "libPath",
            lib,
            "--argstr",
            "pythonPackages",
            json.dumps(python_package_names()),
        ],
    )


@pytest.fixture(scope="module")
def summariser(nix_instantiate, lib_path, tmp_path_factory) -> dict[str, Any]:
    """The module evaluated for one agent with default secret, store and hardening."""
    return evaluate(nix_instantiate, lib_path, SUMMARISER, tmp_path_factory.mktemp("summariser"))


@pytest.fixture
def run_host(nix_instantiate, lib_path, tmp_path):
    return lambda host: evaluate(nix_instantiate, lib_path, host, tmp_path)


def with_summariser(extra: str) -> str:
    """A host module: the summariser agent plus the definitions `extra`."""
    return f"{{ imports = [ {SUMMARISER} ]; {extra} }}"


# -- the unit, as systemd reads the file and as NixOS writes the module's service --------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values in file order (repeated keys such as SystemCallFilter all kept)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, raw
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def nixos_value(value: Any) -> list[str]:
    """The lines NixOS writes for one setting (attrsToSection): one per list item, booleans as words."""
    items = value if isinstance(value, list) else [value]
    return ["true" if v is True else "false" if v is False else str(v) for v in items]


def nixos_unit(service: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """The sections of the unit file NixOS generates from an evaluated systemd.services entry."""
    unit: dict[str, list[str]] = {"Description": [service["description"]]}
    for option, key in (("documentation", "Documentation"), ("wants", "Wants"), ("after", "After")):
        if service[option]:
            unit[key] = [" ".join(service[option])]
    unit |= {key: nixos_value(value) for key, value in service["unitConfig"].items()}
    return {
        "Unit": unit,
        "Service": {key: nixos_value(v) for key, v in service["serviceConfig"].items()},
        # NixOS links wantedBy at build time instead of writing [Install].
        "Install": {"WantedBy": [" ".join(service["wantedBy"])]},
    }


BOOLEANS = {
    "yes": "true",
    "true": "true",
    "on": "true",
    "no": "false",
    "false": "false",
    "off": "false",
}


def normalised(sections: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
    return {
        name: {key: [BOOLEANS.get(v, v) for v in values] for key, values in section.items()}
        for name, section in sections.items()
    }


def shipped_unit(instance: str, package: str) -> dict[str, dict[str, list[str]]]:
    """systemd/hamsterbunker@.service as instance `instance` with hb from `package`."""
    text = UNIT.read_text(encoding="utf-8")
    assert INSTALLED_HB in text
    text = text.replace(INSTALLED_HB, f"{package}/bin/hb").replace("%i", instance)
    return parse_unit(text)


# -- parsing ------------------------------------------------------------------------------


def test_every_nix_file_parses(nix_instantiate):
    """``nix-instantiate --parse`` accepts flake.nix and every .nix file under nix/ and tests/ops/nix/."""
    files = [
        ROOT / "flake.nix",
        *sorted((ROOT / "nix").rglob("*.nix")),
        *sorted(NIX_TESTS.rglob("*.nix")),
    ]
    assert len(files) >= 8, files
    for path in files:
        result = subprocess.run(
            [nix_instantiate, *NIX_OPTIONS, "--parse", str(path)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, f"{path}: {result.stderr}"


# -- the lib the tests evaluate with ----------------------------------------------------------


LIB_CASES = {
    "defaultLosesToPlain": "plain",
    "forceBeatsPlain": 3,
    "optionDefaultLosesToMkDefault": 2,
    "ifFalseDropsEntry": {"s": {"kept": "yes"}},
    "listsAddUp": ["b", "a"],
    "defaultListReplaced": ["b"],
    "submoduleListsAddUp": {"L": ["module", "host"], "M": ["host"]},
    "submoduleNamesAndDefaults": {
        "x": {"count": 3, "enable": True, "label": "agent x"},
        "y": {"count": None, "enable": False, "label": "agent y"},
    },
    "conditionOnOwnConfig": {
        "agents": {"x": {"count": None, "enable": True, "label": "agent x"}},
        "out": {"unit@x": "on"},
    },
    "freeform": {"extra_key": 5, "region": None, "store": "file:///x"},
    "undeclaredFails": True,
    "wrongTypeFails": True,
    "undefinedFails": True,
    "conflictFails": True,
    "positiveRefusesZero": True,
    "pathAcceptsAbsoluteStrings": [True, False],
}


def test_lib_gives_the_module_system_results_the_module_relies_on(nix_instantiate, lib_path):
    """Priorities, mkIf/mkMerge, list merging, submodules and freeform come out as nixpkgs' lib gives them."""
    cases = instantiate(
        nix_instantiate, [str(NIX_TESTS / "lib-cases.nix"), "--argstr", "libPath", lib_path]
    )
    assert cases == LIB_CASES


# -- the generated unit -----------------------------------------------------------------------


def test_generated_unit_matches_the_shipped_unit(summariser):
    """Every setting of hamsterbunker@summariser equals the unit file's, both ways, hb path aside."""
    assert summariser["failedAssertions"] == []
    assert list(summariser["services"]) == ["hamsterbunker@summariser"]
    service = summariser["services"]["hamsterbunker@summariser"]
    package = summariser["package"]["path"]
    assert normalised(nixos_unit(service)) == normalised(shipped_unit("summariser", package))


def test_generated_unit_execs_hb_with_notify_watchdog_and_credential(summariser):
    """ExecStart runs the package's hb itself; Type=notify, the watchdog and the secret credential are set."""
    config = summariser["services"]["hamsterbunker@summariser"]["serviceConfig"]
    package = summariser["package"]["path"]
    assert package.startswith("/nix/store/") and summariser["package"]["name"].startswith(
        "hamsterbunker-"
    )
    assert shlex.split(config["ExecStart"]) == [
        f"{package}/bin/hb",
        "run",
        "--instance",
        "summariser",
    ]
    assert (config["Type"], config["NotifyAccess"], config["WatchdogSec"]) == (
        "notify",
        "main",
        "10s",
    )
    assert config["LoadCredential"] == ["secret:/etc/hamsterbunker/summariser.secret"]
    assert (config["User"], config["Group"]) == ("hamsterbunker", "hamsterbunker")
    assert summariser["systemPackages"] == [summariser["package"]["name"]]


def test_hardening_directives_are_overridable(run_host):
    """A host's plain definitions replace the module's hardening defaults; lists it adds are kept."""
    result = run_host(
        with_summariser(
            """
            systemd.services."hamsterbunker@summariser" = {
              serviceConfig.ProtectHome = "read-only";
              serviceConfig.SystemCallFilter = [ "@system-service" ];
              serviceConfig.ReadWritePaths = [ "/srv/extra" ];
              unitConfig.StartLimitBurst = 10;
            };
            """
        )
    )
    service = result["services"]["hamsterbunker@summariser"]
    config = service["serviceConfig"]
    assert config["ProtectHome"] == "read-only"
    assert config["SystemCallFilter"] == ["@system-service"]
    assert config["ReadWritePaths"] == ["/srv/extra"]
    assert service["unitConfig"]["StartLimitBurst"] == 10
    assert (config["ProtectSystem"], config["MemoryDenyWriteExecute"]) == ("strict", True)


def test_two_agents_give_two_instances(run_host):
    """Two enabled agents give hamsterbunker@a and @b, each with its config and secret; disabled, none."""
    result = run_host(
        """
{
  services.hamsterbunker.agents = {
    a = { enable = true; localOnly = true; settings.agent = "mypkg.agents:A"; secretFile = "/run/keys/a"; };
    b = { enable = true; localOnly = true; settings.agent = "mypkg.agents:B"; secretFile = "/run/keys/b"; };
    off = { settings.agent = "mypkg.agents:Off"; };
  };
}
"""
    )
    assert result["failedAssertions"] == []
    assert sorted(result["services"]) == ["hamsterbunker@a", "hamsterbunker@b"]
    assert sorted(result["etc"]) == ["hamsterbunker/a.toml", "hamsterbunker/b.toml"]
    for name in ("a", "b"):
        service = result["services"][f"hamsterbunker@{name}"]
        config = service["serviceConfig"]
        assert config["ExecStart"].endswith(f"/bin/hb run --instance {name}")
        assert config["LoadCredential"] == [f"secret:/run/keys/{name}"]
        etc = result["etc"][f"hamsterbunker/{name}.toml"]
        assert service["restartTriggers"] == [etc["source"]]
        assert tomllib.loads(etc["text"])["agent"] == f"mypkg.agents:{name.upper()}"


def test_no_enabled_agent_defines_nothing(run_host):
    """With no enabled agent the module adds no unit, user, file or package."""
    result = run_host('{ services.hamsterbunker.agents.off.settings.agent = "m:A"; }')
    assert {k: v for k, v in result.items() if k != "package"} == {
        "failedAssertions": [],
        "services": {},
        "users": {},
        "groups": {},
        "etc": {},
        "systemPackages": [],
    }


# -- the secret ----------------------------------------------------------------------------


def test_secret_inside_the_nix_store_is_refused(run_host):
    """A secretFile in the Nix store, as a path literal or a derivation fails an assertion; /run/keys not."""
    result = run_host(
        """
{ pkgs, ... }:
let agent = secret: { enable = true; localOnly = true; settings.agent = "m:A"; secretFile = secret; }; in
{
  services.hamsterbunker.agents = {
    instore = agent "/nix/store/00000000000000000000000000000000-hb-secret";
    literal = agent ./hb-secret;
    built = agent ((pkgs.formats.toml { }).generate "hb-secret" { });
    fine = agent "/run/keys/hb-secret";
  };
}
"""
    )
    failed = result["failedAssertions"]
    assert len(failed) == 3, failed
    for name, reason in (("instore", "inside the Nix store"), ("built", "inside the Nix store")):
        assert any(f"agents.{name}.secretFile" in m and reason in m for m in failed), failed
    assert any("agents.literal.secretFile is a Nix path literal" in m for m in failed), failed
    assert not any("agents.fine." in m for m in failed), failed
    # The path literal was never copied into the store on the way to the unit.
    literal = result["services"]["hamsterbunker@literal"]["serviceConfig"]["LoadCredential"]
    assert literal[0].startswith("secret:/") and "/nix/store/" not in literal[0], literal


# -- the config file --------------------------------------------------------------------------


def test_rendered_config_is_what_hb_run_reads(summariser):
    """/etc/hamsterbunker/summariser.toml is valid TOML that parse_config accepts with the declared values."""
    (name, etc), *rest = summariser["etc"].items()
    assert not rest
    path = Path("/etc") / name
    assert path == DEFAULT_CONFIG_DIR / "summariser.toml"
    config = parse_config(tomllib.loads(etc["text"]), path)
    assert (config.store, config.agent, config.region) == (
        "file:///var/lib/hamsterbunker/summariser",
        "mypkg.agents:Summariser",
        "eu-central",
    )
    assert config.agent_id is None and (config.tick_ms, config.lease_ttl_ms) == (400, 2000)
    service = summariser["services"]["hamsterbunker@summariser"]
    assert service["restartTriggers"] == [etc["source"]]


def test_every_key_hb_reads_is_accepted_and_rendered(run_host):
    """Settings with every key of hamsterbunker/config.py render to a file parse_config reads back equal."""
    values: dict[str, Any] = {
        # syncdir: the one store sync_delay_ms applies to (2 × (500 + 1000) ≤ 3000).
        "store": "syncdir:///var/lib/hamsterbunker/all",
        "agent": "mypkg.agents:All",
        "agent_id": "all",
        "node_id": "hbnk-1",
        "region": "eu-central",
        "tick_ms": 500,
        "lease_ttl_ms": 3000,
        "sync_delay_ms": 1000,
        "stop_grace_ms": 5000,
        "log_level": "warning",
        "step_retry_ms": 500,
        "step_retry_max_ms": 30000,
        "max_step_failures": 0,
        "http": "127.0.0.1:9100",
        "create_store_on": "hbnk-1",
        "hot_standby": False,
    }
    # agents (several agents) stands in for agent and agent_id: the next test renders it.
    assert set(values) | {"agents"} == set(_TYPES), "config.py has a key this test does not know"
    settings = " ".join(f"{key} = {json.dumps(value)};" for key, value in values.items())
    result = run_host(
        f"{{ services.hamsterbunker.agents.all = {{ enable = true; settings = {{ {settings} }}; }}; }}"
    )
    assert result["failedAssertions"] == []
    document = tomllib.loads(result["etc"]["hamsterbunker/all.toml"]["text"])
    assert document == values
    parse_config(document, DEFAULT_CONFIG_DIR / "all.toml")


def test_several_agents_render_to_what_hb_run_reads(run_host):
    """settings.agents renders to [[agents]] tables (an unset agent_id left out) that
    parse_config reads as the agents of one node process."""
    result = run_host(
        "{ services.hamsterbunker.agents.fleet = { enable = true; settings = {"
        ' store = "etcd://10.0.0.5:2379/hb"; agents = ['
        ' { agent = "mypkg.agents:Support"; agent_id = "support-acme"; }'
        ' { agent = "mypkg.agents:Triage"; } ]; }; }; }'
    )
    assert result["failedAssertions"] == []
    document = tomllib.loads(result["etc"]["hamsterbunker/fleet.toml"]["text"])
    assert document["agents"] == [
        {"agent": "mypkg.agents:Support", "agent_id": "support-acme"},
        {"agent": "mypkg.agents:Triage"},
    ]
    config = parse_config(document, DEFAULT_CONFIG_DIR / "fleet.toml")
    assert [a.agent_id for a in config.hosted()] == ["support-acme", None]


@pytest.mark.parametrize(
    "settings",
    [
        'store = "etcd://h:1/p";',  # neither agent nor agents
        'store = "etcd://h:1/p"; agent = "m:A"; agents = [ { agent = "m:B"; } ];',
        'store = "etcd://h:1/p"; agent_id = "x"; agents = [ { agent = "m:B"; } ];',
    ],
)
def test_agent_and_agents_exclude_each_other(run_host, settings):
    result = run_host(
        f"{{ services.hamsterbunker.agents.fleet = {{ enable = true; settings = {{ {settings} }}; }}; }}"
    )
    assert any("agents" in message for message in result["failedAssertions"]), result


SETTINGS = "services.hamsterbunker.agents.summariser.settings"


def test_log_level_outside_hbs_choices_fails_an_assertion(run_host):
    """settings.log_level takes only what hb run's --log-level takes, checked at build time."""
    result = run_host(with_summariser(f"{SETTINGS}.log_level = {json.dumps('loud')};"))
    assert [a for a in result["failedAssertions"] if "log_level" in a and "loud" in a]
    assert run_host(with_summariser(f'{SETTINGS}.log_level = "debug";'))["failedAssertions"] == []


@pytest.mark.parametrize("http", ["9100", "host:0", "host:65536", "::1:9100", "a b:1"])
def test_http_that_hb_run_refuses_fails_an_assertion(run_host, http):
    """settings.http is checked at build time as hb run checks --http (http_address.py)."""
    with pytest.raises(ConfigError):
        parse_http_address(http)
    result = run_host(with_summariser(f"{SETTINGS}.http = {json.dumps(http)};"))
    assert [a for a in result["failedAssertions"] if "settings.http" in a and http in a]


@pytest.mark.parametrize("http", ["127.0.0.1:9100", "[::1]:9100", ":9100", "localhost:65535"])
def test_http_that_hb_run_takes_passes(run_host, http):
    parse_http_address(http)
    result = run_host(with_summariser(f"{SETTINGS}.http = {json.dumps(http)};"))
    assert result["failedAssertions"] == []


def test_unknown_setting_bad_name_and_store_password_fail_assertions(run_host):
    """A key hb does not read, a name hb refuses and a password in the store URL each fail an assertion."""
    result = run_host(
        """
{
  services.hamsterbunker.agents = {
    typo = { enable = true; localOnly = true; settings = { agent = "m:A"; tick = 5; }; };
    "-bad" = { enable = true; localOnly = true; settings.agent = "m:A"; };
    pw = { enable = true; settings = { agent = "m:A"; store = "redis://hb:s3cret@redis:6379/0"; }; };
    user = { enable = true; settings = { agent = "m:A"; store = "rediss://hb@redis:6379/0"; }; };
    etcd = { enable = true; settings = { agent = "m:A"; store = "etcd://e1:2379,e2:2379/hb"; }; };
  };
}
"""
    )
    failed = result["failedAssertions"]
    assert len(failed) == 3, failed
    assert any("agents.typo.settings: unknown key 'tick'" in m for m in failed), failed
    assert any("agents.-bad: the agent name must be" in m for m in failed), failed
    assert any("agents.pw.settings.store holds a password" in m for m in failed), failed
    assert "s3cret" not in " ".join(failed)


def test_store_or_local_only_is_required(run_host):
    """No settings.store and no localOnly fails an assertion naming both, as hb init refuses it;
    both at once fail too; localOnly alone renders the local store hb init --local-only writes."""
    result = run_host(
        """
{
  services.hamsterbunker.agents = {
    none = { enable = true; settings.agent = "m:A"; };
    both = { enable = true; localOnly = true; settings = { agent = "m:A"; store = "file:///mnt/s"; }; };
    shared = { enable = true; settings = { agent = "m:A"; store = "etcd://e1:2379/hb"; }; };
    local = { enable = true; localOnly = true; settings.agent = "m:A"; };
  };
}
"""
    )
    failed = result["failedAssertions"]
    assert len(failed) == 2, failed
    (none,) = [m for m in failed if "agents.none:" in m]
    for word in ("settings.store", "localOnly = true", "file:///var/lib/hamsterbunker/none"):
        assert word in none, none
    (both,) = [m for m in failed if "agents.both:" in m]
    assert "exclude each other" in both, both
    stores = {
        name: tomllib.loads(result["etc"][f"hamsterbunker/{name}.toml"]["text"])["store"]
        for name in ("shared", "local")
    }
    assert stores == {"shared": "etcd://e1:2379/hb", "local": "file:///var/lib/hamsterbunker/local"}


def test_store_outside_the_state_directory_is_made_writable(run_host):
    """A file:// store on /mnt gets ReadWritePaths= and RequiresMountsFor=; one in StateDirectory neither."""
    result = run_host(
        """
{
  services.hamsterbunker.agents = {
    nfs = { enable = true; settings = { agent = "m:A"; store = "file:///mnt/hamsterbunker"; }; };
    local = { enable = true; settings = { agent = "m:A"; store = "file:///var/lib/hamsterbunker/x"; }; };
  };
}
"""
    )
    nfs = result["services"]["hamsterbunker@nfs"]
    assert nfs["serviceConfig"]["ReadWritePaths"] == ["/mnt/hamsterbunker"]
    assert nfs["unitConfig"]["RequiresMountsFor"] == ["/mnt/hamsterbunker"]
    local = result["services"]["hamsterbunker@local"]
    assert "ReadWritePaths" not in local["serviceConfig"]
    assert "RequiresMountsFor" not in local["unitConfig"]


# -- the user ------------------------------------------------------------------------------------


def test_static_user_matches_sysusers_and_takes_a_fixed_uid(summariser, run_host):
    """The user is the sysusers.d one; uid/gid pin it for NFS; a user of the host's own is not created."""
    kind, name, _uid, description, home, _shell = shlex.split(
        next(
            line
            for line in SYSUSERS.read_text(encoding="utf-8").splitlines()
            if line.startswith("u ")
        )
    )
    assert (kind, name) == ("u", "hamsterbunker")
    assert summariser["users"] == {
        name: {
            "isSystemUser": True,
            "group": name,
            "uid": None,
            "description": description,
            "home": home,
        }
    }
    assert summariser["groups"] == {name: {"gid": None}}

    pinned = run_host(with_summariser("services.hamsterbunker = { uid = 850; gid = 850; };"))
    assert pinned["users"][name]["uid"] == 850 and pinned["groups"][name]["gid"] == 850

    other = run_host(
        with_summariser('services.hamsterbunker = { user = "alice"; group = "users"; };')
    )
    assert other["users"] == {} and other["groups"] == {}
    config = other["services"]["hamsterbunker@summariser"]["serviceConfig"]
    assert (config["User"], config["Group"]) == ("alice", "users")


# -- the package, the flake and the README -------------------------------------------------------


def test_package_and_flake_match_pyproject(nix_instantiate, lib_path):
    """nix/package.nix needs pyproject's requirements and packaged extras, no more; the flake exposes it."""
    flake = instantiate(
        nix_instantiate,
        [
            str(NIX_TESTS / "flake-eval.nix"),
            "--argstr",
            "libPath",
            lib_path,
            "--argstr",
            "pythonPackages",
            json.dumps(python_package_names()),
        ],
    )
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    unpackaged = {"test", "bench", *AGENT_EXTRAS}
    assert set(project["optional-dependencies"]) - unpackaged == set(PACKAGED_EXTRAS)
    names = sorted(requirement_name(r) for r in project["dependencies"])
    extras = {
        extra: [requirement_name(r) for r in project["optional-dependencies"][extra]]
        for extra in PACKAGED_EXTRAS
    }
    assert flake["package"] == {
        "name": f"hamsterbunker-{project['version']}",
        "pyproject": True,
        "buildSystem": ["setuptools"],
        "dependencies": sorted(names + [n for extra in extras.values() for n in extra]),
        "importsChecked": ["hamsterbunker", "hamsterbunker_tui"],
        "mainProgram": "hb",
    }
    assert set(project["scripts"]) == {"hb", "hb-tui"}
    assert flake["withoutExtras"]["dependencies"] == names
    assert flake["withoutExtras"]["importsChecked"] == ["hamsterbunker"]
    assert "etcd3gw" in extras["etcd"]
    assert flake["withoutEtcd3gw"]["dependencies"] == sorted(
        set(flake["package"]["dependencies"]) - {"etcd3gw"}
    )
    assert flake["inputs"] == ["nixpkgs"]
    assert flake["systems"] == ["aarch64-linux", "x86_64-linux"]
    assert flake["moduleIsNixModule"] is True
    assert flake["overlay"] == flake["package"]["name"]


def readme_nixos_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("\n## NixOS\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```nix\n(.*?)```", section, flags=re.S)


def test_readme_nixos_example_evaluates(run_host, nix_instantiate):
    """The README's NixOS snippets parse, and its configuration evaluates without a failed assertion."""
    blocks = readme_nixos_blocks()
    assert len(blocks) >= 2, blocks
    for block in blocks:
        result = subprocess.run(
            [nix_instantiate, *NIX_OPTIONS, "--parse", "-E", block],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, f"{block}\n{result.stderr}"
    example = next(b for b in blocks if "agents.summariser" in b and "inputs" not in b)
    result = run_host(example)
    assert result["failedAssertions"] == []
    config = result["services"]["hamsterbunker@summariser"]["serviceConfig"]
    assert config["LoadCredential"] == ["secret:/run/keys/hb-secret"]
    parse_config(
        tomllib.loads(result["etc"]["hamsterbunker/summariser.toml"]["text"]),
        DEFAULT_CONFIG_DIR / "summariser.toml",
    )
