"""The house rules that docs/DEVELOPING.md states: the layering of the modules (every import, at the top of a file
or inside a function) and where the options namespace may go (the count of functions with an ``opt`` parameter)."""
import ast
import pathlib
import re

import pytest

import helpers

ROOT = pathlib.Path(helpers.ROOT)

MAX_OPT_FUNCTIONS = 25


def stated_layers():
    """``[[module, ...], ...]``: the layers listed in docs/DEVELOPING.md, earliest first."""
    text = (ROOT / 'docs' / 'DEVELOPING.md').read_text()
    block = re.search(r'<!-- layers:.*?-->\n(.*?)<!-- /layers -->', text, re.S).group(1)
    return [[m.strip() for m in line.split('.', 1)[1].split(',')] for line in block.strip().splitlines()]


def project_modules():
    """``{module name: [source files]}``: the top-level modules and the packages (``networks``, ``data``)."""
    modules = {p.stem: [p] for p in ROOT.glob('*.py')}
    for package in ROOT.glob('*/__init__.py'):
        if package.parent.name not in ('tests', 'benchmarks'):
            modules[package.parent.name] = sorted(package.parent.glob('*.py'))
    return modules


def imports_of(source, known):
    """``{(imported module, line, 'top' | 'inside')}``: the imports of project modules in ``source``, at the top
    of the file or anywhere below it (in a function, a class, a conditional)."""
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split('.')[0]
            if root in known:
                found.add((root, node.lineno, 'top' if id(node) in top else 'inside'))
    return found


def import_graph(modules, sources=None):
    """``{module: {(imported, line, where)}}``; ``sources`` replaces a module's text (the power checks)."""
    sources = sources or {}
    graph = {}
    for name, files in modules.items():
        texts = [sources[name]] if name in sources else [f.read_text() for f in files]
        graph[name] = {edge for text in texts for edge in imports_of(text, modules) if edge[0] != name}
    return graph


def against_the_order(graph, layers):
    """``['a imports b (line N, inside a function)', ...]``: imports of a module of the same or a later layer."""
    layer_of = {m: i for i, layer in enumerate(layers) for m in layer}
    return sorted(f'{m} imports {dep} (line {line}, {where})' for m, edges in graph.items()
                  for dep, line, where in edges if layer_of[dep] >= layer_of[m])


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


def test_every_module_is_placed_in_one_layer():
    placed = [m for layer in stated_layers() for m in layer]
    assert len(placed) == len(set(placed)), 'a module is listed twice'
    assert sorted(placed) == sorted(project_modules()), 'docs/DEVELOPING.md\'s layers and the modules differ'


def test_no_import_against_the_layering_and_no_circle():
    graph = import_graph(project_modules())
    assert against_the_order(graph, stated_layers()) == []
    assert circles(graph) == []


def test_a_doctored_import_is_caught():
    """Power: an import inside a function that goes back up (``util`` reaching for ``engine``) is a violation
    and, with engine's own import of util, a circle."""
    modules = project_modules()
    doctored = (ROOT / 'util.py').read_text() + '\n\ndef late():\n    from engine import fit\n    return fit\n'
    graph = import_graph(modules, {'util': doctored})
    bad = against_the_order(graph, stated_layers())
    assert len(bad) == 1 and bad[0].startswith('util imports engine') and 'inside' in bad[0]
    assert any(c[0] == c[-1] and {'util', 'engine'} <= set(c) for c in circles(graph))


def functions_with_opt(modules, root=ROOT):
    """``['file:line function', ...]``: every function (``def`` or ``lambda``) with a parameter named ``opt``."""
    out = []
    for files in modules.values():
        for path in files:
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
    assert len(functions_with_opt({'leaf': [tmp_path / 'leaf.py']}, tmp_path)) == expected


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
    assert namespaces_built([p for p in python_files() if p.relative_to(ROOT) != pathlib.Path('options.py')]) == []
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
    """No function of the training step, the loop and the run (steps.py, loop.py, engine.py, probes.py) takes more
    than 7 parameters: what belongs together travels as the object that owns it (``steps.CarrotTerm``,
    ``loop.Optimization``, a trainer). Power: an 8-parameter function is caught."""
    assert wide_functions([ROOT / 'steps.py', ROOT / 'loop.py', ROOT / 'engine.py', ROOT / 'probes.py']) == []
    wide = tmp_path / 'wide.py'
    wide.write_text('def f(a, b, c, d, e, g, h, i):\n    pass\n\n\nclass K:\n    def m(self, a, b, c, d, e, g, h):\n'
                    '        pass\n')
    assert wide_functions([wide]) == ['wide.py:1 f (8)']
