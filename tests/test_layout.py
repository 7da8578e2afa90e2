"""The layout is the pipeline: imports point one way, from the public API down to the base.
runner/ starts and supervises processes and knows nothing about graphs."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Lowest first: a module imports its own layer or lower ones, never a higher one.
LAYERS = [
    ("processes", ["runner"]),
    ("base", ["parallax.errors", "parallax.config", "parallax.cluster", "parallax.contracts",
              "parallax.tf_private", "parallax.vocabulary", "parallax.graph_copy",
              "parallax.tf_logs"]),
    ("collectives", ["parallax.collectives"]),
    ("capture", ["parallax.capture", "parallax.partitioner", "parallax.embeddings"]),
    ("planning", ["parallax.planning"]),
    ("rewriting", ["parallax.rewriting"]),
    ("runtime", ["parallax.runtime"]),
    ("entry points", ["parallax.launch", "parallax.driver", "parallax.worker"]),
    ("public API", ["parallax.api", "parallax"]),
]


def _layer(module: str) -> int:
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS)
               for prefix in prefixes if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} belongs to no layer: add it to LAYERS"
    return max(matches)[1]


def _modules(package="parallax"):
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(module: str, path: pathlib.Path):
    """The parallax and runner modules `module` imports, anywhere in it (a function's imports
    too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


MODULES = {**dict(_modules()), **dict(_modules("runner"))}
EDGES = {module: set(_imports(module, path)) for module, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_pipeline(module):
    upward = [(target, LAYERS[_layer(target)][0]) for target in sorted(EDGES[module])
              if _layer(target) > _layer(module)]
    assert not upward, (f"{module} ({LAYERS[_layer(module)][0]}) imports from a later stage: "
                        f"{upward}")


def test_the_import_graph_has_no_cycles():
    done, visiting = set(), []

    def visit(module):
        if module in visiting:
            cycle = visiting[visiting.index(module):] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        visiting.append(module)
        for target in sorted(EDGES[module]):
            if target not in ("parallax", "runner"):  # a package's __init__ comes with it
                visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(MODULES):
        visit(module)


def test_planning_never_imports_rewriting_or_runtime():
    for module, targets in EDGES.items():
        if module.startswith("parallax.planning"):
            assert not [t for t in targets if t.startswith(("parallax.rewriting",
                                                            "parallax.runtime"))], module


# Horovod's graph ops and membership (the Collectives seam), and its rendezvous server, which the
# launcher starts for a job's workers.
HOROVOD_IMPORTERS = {"parallax/collectives/horovod.py", "runner/rendezvous.py"}


def test_horovod_is_imported_only_behind_the_collectives_seam():
    importers = set()
    for path in sorted(ROOT.glob("parallax/**/*.py")) + sorted(ROOT.glob("runner/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "horovod" for name in names):
                importers.add(str(path.relative_to(ROOT)))
    assert importers == HOROVOD_IMPORTERS


@pytest.mark.job
def test_what_importing_loads_and_starts():
    """runner imports no TensorFlow and no parallax; importing parallax only installs the
    gradient capture: no heartbeat (a worker's starts at its first Parallax call; it takes its
    settings out of the environment), no patch of tf.compat.v1.train.Saver (a worker's
    get_runner installs it)."""
    code = ("import sys, runner, runner.ssh, runner.remote_exec, runner.free_ports; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'parallax', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "[]"
    code = ("import os, tensorflow as tf\nsave = tf.compat.v1.train.Saver.save\n"
            "import parallax\n"
            "print(os.environ.get('PARALLAX_CONTROL'), tf.compat.v1.train.Saver.save is save)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=dict(os.environ, PARALLAX_CONTROL="{}"))
    assert out.stdout.split() == ["{}", "True"], out.stdout


def test_every_pipeline_is_in_an_order_its_passes_declare_possible():
    from parallax.rewriting import pipeline

    for pipelines in (pipeline._PIPELINES, pipeline._ASYNC_PIPELINES):
        for passes in pipelines.values():
            pipeline.check_order(passes)
            assert all(hasattr(p, "declaration") for p in passes)


def test_a_pass_before_what_it_needs_is_named():
    from parallax.errors import ParallaxError
    from parallax.rewriting import pipeline
    from parallax.rewriting.passes.ps import aggregate_on_servers, place_variables_on_servers

    with pytest.raises(ParallaxError, match=r"pass aggregate_on_servers needs \['server "
                                            r"variables placed'\], which no pass before it"):
        pipeline.check_order([aggregate_on_servers, place_variables_on_servers])


def test_the_paths_named_in_docstrings_and_docs_exist():
    """A path written in the code's docstrings and comments, or in the docs, names a file of
    the layout (from the repository's root, or from a folder of it: rewriting/pipeline.py)."""
    files = [str(p.relative_to(ROOT)) for p in ROOT.glob("**/*.py")
             if not any(part.startswith(".venv") for part in p.parts)]
    sources = (sorted(ROOT.glob("parallax/**/*.py")) + sorted(ROOT.glob("runner/**/*.py"))
               + sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"])
    stale = set()
    for source in sources:
        for path in re.findall(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b", source.read_text()):
            if path != "examples/NAME.py" and not any(
                    f == path or f.endswith("/" + path) for f in files):
                stale.add(f"{source.relative_to(ROOT)}: {path}")
    assert not stale, sorted(stale)
