"""The house rules that docs/DEVELOPING.md states: the layering of the modules (every import, at the top of a file
or inside a function) and where the options namespace may go (the count of functions with an ``opt`` parameter)."""
import ast
import pathlib
import re

import pytest

import helpers

ROOT = pathlib.Path(helpers.ROOT)

MAX_OPT_FUNCTIONS = 25


# What the root holds: the scripts and SupContrast's files, the loss files and the registry, the user's commands
ROOT_FILES = {'main_supcon', 'main_ce', 'main_linear', 'losses', 'losses_rascal', 'losses_carrot', 'datasets_indexed',
              'util', 'methods', 'sweep', 'compare', 'analyze', 'export'}
MAX_ROOT_FILES = 16
MAX_LINES = 500
MAX_LINES_OF = {'config/options.py': 250}


def stated_layers():
    """``[[unit, ...], ...]``: the layers listed in docs/DEVELOPING.md, earliest first; a unit is a file at the root
    or a package folder."""
    text = (ROOT / 'docs' / 'DEVELOPING.md').read_text()
    block = re.search(r'<!-- layers:.*?-->\n(.*?)<!-- /layers -->', text, re.S).group(1)
    return [[m.strip().strip('`').rstrip('/') for m in line.split('.', 1)[1].split(',')]
            for line in block.strip().splitlines()]


def project_modules(root=ROOT):
    """``{module: source file}``: the files at the root (``losses``) and the modules of the package folders
    (``training.steps``; a package's ``__init__.py`` is the package's own name, ``data``)."""
    modules = {p.stem: p for p in root.glob('*.py')}
    for init in root.glob('*/__init__.py'):
        package = init.parent.name
        if package not in ('tests', 'benchmarks'):
            for p in sorted(init.parent.rglob('*.py')):         # sub-packages too (sweeping.tuning.tuner)
                name = '.'.join(p.relative_to(root).with_suffix('').parts)
                modules[name[:-len('.__init__')] if name.endswith('.__init__') else name] = p
    return modules


def unit_of(module):
    return module.split('.')[0]


def imports_of(source, module, known):
    """``{(imported module, line, 'top' | 'inside')}``: the imports of project modules in ``source`` (the text of
    ``module``), at the top of the file or anywhere below it (in a function, a class, a conditional). ``from
    training import steps`` is ``training.steps``; a relative import is resolved in ``module``'s package."""
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    package = module if known[module].name == '__init__.py' else module.rpartition('.')[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                base = f'{package}.{base}' if base else package
            names = [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition('.')[0]
            if name:
                found.add((name, node.lineno, 'top' if id(node) in top else 'inside'))
    return found


def import_graph(modules, sources=None):
    """``{module: {(imported module, line, where)}}``; ``sources`` replaces a module's text (the power checks)."""
    sources = sources or {}
    return {name: {edge for edge in imports_of(sources.get(name) or path.read_text(), name, modules)
                   if edge[0] != name} for name, path in modules.items()}


def against_the_order(graph, layers):
    """``['a imports b (line N, inside a function)', ...]``: imports of a module of another unit of the same or a
    later layer (units: root files and package folders)."""
    layer_of = {u: i for i, layer in enumerate(layers) for u in layer}
    return sorted(f'{m} imports {dep} (line {line}, {where})' for m, edges in graph.items()
                  for dep, line, where in edges
                  if unit_of(dep) != unit_of(m) and layer_of[unit_of(dep)] >= layer_of[unit_of(m)])


def circles(graph):
    """The import circles of ``graph`` (each as a list of modules), by depth-first search."""
    found, state = [], {}

    def visit(m, path):
        state[m] = 'open'
        for dep in sorted({d for d, _, _ in graph.get(m, ())}):
            if state.get(dep) == 'open':
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[m] = 'done'
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_every_unit_is_placed_in_one_layer():
    placed = [u for layer in stated_layers() for u in layer]
    assert len(placed) == len(set(placed)), 'a unit is listed twice'
    assert sorted(placed) == sorted({unit_of(m) for m in project_modules()}), \
        'docs/DEVELOPING.md\'s layers and the root files and package folders differ'


def test_no_import_against_the_layering_and_no_circle():
    """Between units: only down the layers. Inside a package folder: no circle among its modules (a package's
    ``__init__`` may gather its modules' names)."""
    graph = import_graph(project_modules())
    assert against_the_order(graph, stated_layers()) == []
    inner = {m: {e for e in edges if unit_of(e[0]) == unit_of(m) and e[0] != unit_of(m)}
             for m, edges in graph.items()}
    assert circles(inner) == []


def test_a_doctored_import_is_caught():
    """Power: an import inside a function that goes back up (``util`` reaching for the engine) is a violation and,
    with the engine's own import chain down to util, a circle; inside a folder, ``training/loop.py`` reaching for
    ``training.steps`` (which imports the loop) is a circle."""
    modules = project_modules()
    doctored = (ROOT / 'util.py').read_text() + '\n\ndef late():\n    from engine.run import fit\n    return fit\n'
    graph = import_graph(modules, {'util': doctored})
    bad = against_the_order(graph, stated_layers())
    assert len(bad) == 1 and bad[0].startswith('util imports engine.run') and 'inside' in bad[0]
    assert any(c[0] == c[-1] and {'util', 'engine.run'} <= set(c) for c in circles(graph))
    loop = (ROOT / 'training' / 'loop.py').read_text() + '\n\ndef late():\n    from training import steps\n'
    graph = import_graph(modules, {'training.loop': loop})
    assert against_the_order(graph, stated_layers()) == []
    inner = {m: {e for e in edges if unit_of(e[0]) == unit_of(m)} for m, edges in graph.items()}
    assert any({'training.loop', 'training.steps'} <= set(c) for c in circles(inner))


TRACKER_PACKAGES = ('wandb', 'mlflow', 'torch.utils.tensorboard')


def tracker_imports(source):
    """The lines of ``source`` that import W&B, MLflow or TensorBoard (anywhere in the file)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ''] if isinstance(node, ast.ImportFrom) else []
        if any(n == p or n.startswith(p + '.') for n in names for p in TRACKER_PACKAGES):
            found.append(node.lineno)
    return found


def test_only_tracking_calls_the_trackers():
    """Every import of W&B, MLflow and TensorBoard is in ``tracking/`` (the scripts, benchmarks and the rest call
    it); power check: a doctored import elsewhere is found."""
    sources = {p: p.read_text() for p in python_files_outside_tests() if p.relative_to(ROOT).parts[0] != 'tracking'}
    assert {str(p.relative_to(ROOT)): lines for p, text in sources.items() if (lines := tracker_imports(text))} == {}
    assert tracker_imports('def f():\n    from torch.utils.tensorboard import SummaryWriter\n') == [2]
    assert tracker_imports('import mlflow.tracking\n') == [1] and tracker_imports('import mlflowish\n') == []


def test_the_root_holds_the_design_files_the_loss_files_the_registry_and_the_commands():
    root = sorted(p.stem for p in ROOT.glob('*.py'))
    assert len(root) <= MAX_ROOT_FILES, root
    assert [m for m in root if m not in ROOT_FILES and not m.startswith('losses_')] == [], \
        'a module at the root that is none of the scripts, loss files, the registry or the commands: give it a folder'


def long_files(paths, root=ROOT):
    """``['file (N lines, at most M)', ...]``: the files of ``paths`` over their length."""
    out = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        n, limit = len(path.read_text().splitlines()), MAX_LINES_OF.get(rel, MAX_LINES)
        if n > limit:
            out.append(f'{rel} ({n} lines, at most {limit})')
    return out


def python_files_outside_tests(root=ROOT):
    """Every ``.py`` file of the repository but the suite's (``benchmarks/`` and its packages included)."""
    parts = {p: p.relative_to(root).parts for p in root.rglob('*.py')}
    return [p for p, rel in parts.items() if rel[0] != 'tests' and not any(s.startswith('.') for s in rel)]


def test_no_module_over_its_length(tmp_path):
    """Every module outside tests/ (the root, the packages, benchmarks/) stays under 500 lines (config/options.py
    under 250). Power: a 501-line file is caught."""
    files = python_files_outside_tests()
    assert any('benchmarks' in p.parts for p in files) and long_files(files) == []
    (tmp_path / 'long.py').write_text('x = 1\n' * 501)
    assert long_files([tmp_path / 'long.py'], tmp_path) == ['long.py (501 lines, at most 500)']


def functions_with_opt(modules, root=ROOT):
    """``['file:line function', ...]``: every function (``def`` or ``lambda``) with a parameter named ``opt``."""
    out = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == 'opt' for a in args):
                    name = getattr(node, 'name', '<lambda>')
                    out.append(f'{path.relative_to(root)}:{node.lineno} {name}')
    return sorted(out)


def test_opt_stays_where_configuration_is_decided(capsys):
    found = functions_with_opt(project_modules())
    with capsys.disabled():
        print(f'\n{len(found)} functions take opt (at most {MAX_OPT_FUNCTIONS}):\n  ' + '\n  '.join(found))
    assert len(found) <= MAX_OPT_FUNCTIONS, found


@pytest.mark.parametrize('source, expected', [('def leaf(opt, x):\n    return x\n', 1),
                                              ('f = lambda opt: opt.x\n', 1), ('def leaf(device, x):\n    pass\n', 0)])
def test_the_opt_count_sees_defs_and_lambdas(tmp_path, source, expected):
    """Power: a leaf that takes ``opt`` (a def or a lambda) is counted."""
    (tmp_path / 'leaf.py').write_text(source)
    assert len(functions_with_opt({'leaf': tmp_path / 'leaf.py'}, tmp_path)) == expected


def namespaces_built(paths, root=ROOT):
    """``['file:line', ...]``: every call that builds a namespace by hand (``argparse.Namespace(...)``,
    ``SimpleNamespace(...)``, also under another import name) in ``paths``."""
    out = []
    for path in paths:
        tree = ast.parse(path.read_text())
        names = {'Namespace', 'SimpleNamespace'}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names |= {a.asname for a in node.names if a.name in ('Namespace', 'SimpleNamespace') and a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
                if name in names:
                    out.append(f'{path.relative_to(root)}:{node.lineno}')
    return sorted(out)


def python_files():
    skip = {'.venv', '.venv-gpu-image', 'save', 'datasets', '.git'}
    return [p for p in ROOT.rglob('*.py') if not skip & set(p.relative_to(ROOT).parts)]


def test_options_are_made_by_the_parser_only(tmp_path):
    """Options come from ``options.parse_option`` (tests: ``helpers.make_options``), never a namespace
    built by hand, so a new flag can never break a test, a benchmark or analyze.py. Power: a doctored file's two
    namespaces (one under another import name) are caught."""
    options = pathlib.Path('config/options.py')
    assert namespaces_built([p for p in python_files() if p.relative_to(ROOT) != options]) == []
    doctored = tmp_path / 'doctored.py'
    doctored.write_text('import argparse\nfrom types import SimpleNamespace as NS\n'
                        'a = argparse.Namespace(dataset="digits")\nb = NS(size=8)\n')
    assert namespaces_built([doctored], tmp_path) == ['doctored.py:3', 'doctored.py:4']


MAX_STEP_PARAMETERS = 7


def wide_functions(paths, limit=MAX_STEP_PARAMETERS):
    """``['file:line name (N)', ...]``: functions (methods counted without ``self``) with more than ``limit``
    parameters."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x]
                n = len([x for x in names if x not in ('self', 'cls')])
                if n > limit:
                    out.append(f'{path.name}:{node.lineno} {node.name} ({n})')
    return out


def test_step_functions_stay_narrow(tmp_path):
    """No function of the training step, the loop and the run (training/steps.py, training/chunks.py,
    training/loop.py, engine/run.py, evaluation/probes.py) takes more than 7 parameters: what belongs together
    travels as the object that owns it (``carrot.CarrotTerm``, ``loop.Optimization``, a trainer). Power: an
    8-parameter function is caught."""
    narrow = ['training/steps.py', 'training/carrot.py', 'training/chunks.py', 'training/loop.py', 'engine/run.py',
              'evaluation/probes.py']
    assert wide_functions([ROOT / p for p in narrow]) == []
    wide = tmp_path / 'wide.py'
    wide.write_text('def f(a, b, c, d, e, g, h, i):\n    pass\n\n\nclass K:\n    def m(self, a, b, c, d, e, g, h):\n'
                    '        pass\n')
    assert wide_functions([wide]) == ['wide.py:1 f (8)']
