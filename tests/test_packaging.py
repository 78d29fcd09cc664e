"""ctlwire installs as a package, not only as a checkout.

The wheel and the sdist built from this tree hold every module of it; the wheel,
installed into a fresh virtual environment and used from a directory with no
checkout, imports every module, runs the command line and the demo, and loads the
pytest plugin; ``mypy --strict`` sees the types of an editable install and of the
wheel. ``.ci/run`` builds that environment once and names it in
``CTLWIRE_WHEEL_VENV``; without it, the tests build their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the folders src/ctlwire links to (one relative symlink each)
FOLDERS = tuple(sorted(p.name for p in (ROOT / "src" / "ctlwire").iterdir()))

pytestmark = pytest.mark.timeout(600)


def _tree_modules() -> set[str]:
    """``ctlwire/<folder>/...py`` for every Python file git tracks in the package folders."""
    out = subprocess.run(["git", "ls-files", *FOLDERS], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return {f"ctlwire/{p}" for p in out if p.endswith(".py")}


def _module_name(path: str) -> str:
    name = path.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _clean_env() -> dict[str, str]:
    """The environment without anything that would import the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wheel and an sdist built from this tree (setuptools' PEP 517 hooks), in a
    copy of the files git sees: a ``build/`` folder left in the checkout would put
    its stale copies of modules the configuration misses into the wheel."""
    out = tmp_path_factory.mktemp("dist")
    tree = tmp_path_factory.mktemp("tree")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source, copy = ROOT / name, tree / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in git
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, copy)
    script = textwrap.dedent(f"""
        from setuptools import build_meta
        print(build_meta.build_sdist({str(out)!r}))
        print(build_meta.build_wheel({str(out)!r}))
    """)
    _run([sys.executable, "-c", script], cwd=tree)
    (sdist,) = out.glob("ctlwire-*.tar.gz")
    (wheel,) = out.glob("ctlwire-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def wheel_venv(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with the wheel installed (``[testing]`` extra, for the plugin)."""
    given = os.environ.get("CTLWIRE_WHEEL_VENV")
    if given:
        return Path(given)
    venv = tmp_path_factory.mktemp("wheelvenv") / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
          f"{dists['wheel']}[testing]"], cwd=venv.parent, timeout=600)
    return venv


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A working directory with no checkout in it or above it."""
    assert not any((p / "pyproject.toml").exists() for p in (tmp_path, *tmp_path.parents))
    yield tmp_path


def test_the_wheel_holds_every_module_of_the_tree(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
    in_wheel = {n for n in names if n.endswith(".py")}
    assert in_wheel == _tree_modules()
    assert {"app", "conformance", "kernel", "states", "testing", "transports"} <= set(FOLDERS)
    for folder in ("kernel", "states", "transports", "app", "testing", "conformance",
                   "integrations"):
        assert f"ctlwire/{folder}/py.typed" in names


def test_the_sdist_holds_every_module_of_the_tree(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
    shipped = {p.removeprefix("src/") for p, m in members.items()
               if p.startswith("src/ctlwire/") and p.endswith(".py") and m.isfile()}
    assert shipped == _tree_modules()
    assert "pyproject.toml" in members


def test_every_module_imports_from_the_installed_wheel(wheel_venv: Path, outside: Path) -> None:
    modules = sorted(name for name in map(_module_name, _tree_modules())
                     if not name.endswith(".__main__"))  # those run a program
    script = textwrap.dedent("""
        import importlib, json, sys
        optional = {"torch", "httpx", "graphviz", "prometheus_client", "opentelemetry",
                    "numpy", "fastapi", "uvicorn", "trio", "hypothesis", "mkdocs"}
        failed, skipped, files = {}, {}, set()
        for name in json.loads(sys.argv[1]):
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                top = (exc.name or "").split(".")[0]
                (skipped if top in optional else failed)[name] = repr(exc)
                continue
            files.add(getattr(module, "__file__", "") or "")
        print(json.dumps({"failed": failed, "skipped": skipped, "files": sorted(files)}))
    """)
    import json
    done = _run([str(wheel_venv / "bin" / "python"), "-c", script, json.dumps(modules)],
                cwd=outside)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
    # the public facades import without any optional dependency
    for package in ("ctlwire.kernel", "ctlwire.states", "ctlwire.transports"):
        assert package not in report["skipped"]
    site = str(wheel_venv.resolve())
    assert report["files"] and all(f.startswith(site) for f in report["files"]), (
        "a module came from outside the installed wheel")


def test_the_command_line_and_the_demo_run_from_the_installed_wheel(
        wheel_venv: Path, outside: Path) -> None:
    ctlwire = str(wheel_venv / "bin" / "ctlwire")
    version = _run([ctlwire, "--version"], cwd=outside).stdout
    assert "0." in version or "1." in version
    demo = _run([ctlwire, "demo", "--engines", "2", "--cycles", "2", "--slow-update", "0"],
                cwd=outside, timeout=180)
    assert "OK: every invariant holds" in demo.stdout


def test_the_pytest_plugin_loads_from_the_installed_wheel(
        wheel_venv: Path, outside: Path) -> None:
    (outside / "test_engine.py").write_text(textwrap.dedent("""
        import pytest

        def setup(endpoint):
            @endpoint.method()
            def double(x: int) -> int:
                return 2 * x

        @pytest.mark.anyio
        async def test_double(ctlwire_harness, transition_recorder):
            async with ctlwire_harness(ranks=1, setup=setup) as h:
                assert await h.client.call("double", 21, rank=0, timeout=10) == 42
            (rid,) = transition_recorder.ids("double")
            assert transition_recorder.path(rid)[-1] == "CLEANED"
    """))
    done = _run([str(wheel_venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "test_engine.py"], cwd=outside)
    assert "1 passed" in done.stdout


def test_the_readmes_python_blocks_run_from_the_installed_wheel(
        wheel_venv: Path, outside: Path) -> None:
    """What a new user copies first: each README block that runs in the suite runs
    from the wheel as well, outside the checkout."""
    from test_readme import BLOCKS

    ran = 0
    for _, kind, code in BLOCKS:
        if kind.startswith("skip"):
            continue
        name = "test_readme_block.py" if kind == "pytest" else "readme_block.py"
        (outside / name).write_text(code)
        cmd = ([str(wheel_venv / "bin" / "python"), "-m", "pytest", "-q", "-p",
                "no:cacheprovider", name] if kind == "pytest"
               else [str(wheel_venv / "bin" / "python"), name])
        _run(cmd, cwd=outside, timeout=120)
        ran += 1
    assert ran >= 2, BLOCKS


USER_CODE = '''
from ctlwire.kernel import ControlClient, EngineEndpoint
from ctlwire.transports import ZmqRouterClientTransport


async def ask(address: str) -> int:
    async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as client:
        answer: int = await client.call("double", 21, rank=0, timeout=5)
        return answer


def engine(endpoint: EngineEndpoint) -> None:
    @endpoint.method()
    def double(x: int) -> int:
        return 2 * x


wrong: str = ControlClient  # the checker must see ctlwire's types to refuse this
'''


def _mypy_user_code(python: Path, where: Path) -> str:
    (where / "user.py").write_text(USER_CODE)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--python-executable", str(python), "user.py"],
        cwd=where, env=_clean_env(), capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def _assert_types_seen(output: str) -> None:
    assert "missing library stubs or py.typed" not in output, output
    assert "Cannot find implementation or library stub" not in output, output
    # exactly the one planted error, which only a checker that sees the types finds
    assert 'error: Incompatible types in assignment' in output, output
    assert "Found 1 error in 1 file" in output, output


def test_mypy_sees_the_types_of_an_editable_install(outside: Path) -> None:
    pytest.importorskip("mypy")
    _assert_types_seen(_mypy_user_code(Path(sys.executable), outside))


def test_mypy_sees_the_types_of_the_installed_wheel(wheel_venv: Path, outside: Path) -> None:
    pytest.importorskip("mypy")
    _assert_types_seen(_mypy_user_code(wheel_venv / "bin" / "python", outside))
