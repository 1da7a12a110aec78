"""The five figures in real frontends, driven in headless Chromium (``make test-frontends``).

Two frontends, each a server on 127.0.0.1 with a random token:

* ``lab``: JupyterLab 4 with ipywidgets 8, from ``.venv`` (the course's own set-up);
* ``notebook6``: classic Notebook 6.5 with ipywidgets 7.7.1 (Colab's widget protocol), from the
  Colab-like ``.venv-colab`` of ``make test-colab``.

For every notebook of ``notebooks/`` (a copy): open it, run all cells, then for every figure
the notebook shows, assert that its widget view rendered (no "Error displaying widget", an
image of non-zero size), move one of its controls and assert that the image changes. Each
figure's view is saved to ``docs/figures/`` (the README shows the JupyterLab ones).

And a student's notebook with wrong answers (notebook 02 with a merge that has no max shift
and a block_attention that raises): Run All reaches the end, each check's output reads like
a tutor (what differs, where, a hint), no file or line of course code appears, only the
raising answer shows a traceback, of the student's own cell, and the figures still render.

And notebook 03 of the self-study edition (``release --self-study``): every folded solution is
closed when the notebook opens and shows the solved cell's code when its summary is clicked.

The browser is Debian's ``chromium`` (``apt-get install chromium``; ``.ci/run`` installs it),
driven by the ``playwright`` package with ``executable_path``: no browser download. Without
Chromium or playwright the test skips and says how to get them.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.frontends

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "figures"
CHROMIUM = os.environ.get("LESSON10_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIGURE_CALL = re.compile(r"\bfigures\.(ring_rounds|sp_strip|block_size|ulysses_grid|moe_capacity)\(")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"]
FRONTENDS = {
    "lab": {"python": ROOT / ".venv" / "bin" / "python", "app": "lab", "module": "jupyterlab", "version": "4.",
            "ipywidgets": "8."},
    "notebook6": {"python": ROOT / ".venv-colab" / "bin" / "python", "app": "notebook", "module": "notebook",
                  "version": "6.5", "ipywidgets": "7.7.1"},
}


SELF_STUDY = "03_self_study.ipynb"                 # notebook 03 of `release --self-study`
ONE_FIGURE = "one_figure.ipynb"                    # a figure cell, nothing else
WRONG_NOTEBOOK = "02_wrong_answers.ipynb"
WRONG_CELLS = {
    "def merge(": '''def merge(o1, lse1, o2, lse2):
    lse = np.log(np.exp(lse1) + np.exp(lse2))          # no max shift
    return np.exp(lse1 - lse)[..., None] * o1 + np.exp(lse2 - lse)[..., None] * o2, lse
''',
    "def block_attention(": '''def block_attention(q, k, v, q_pos, k_pos, causal=True):
    scores = q @ k.T                                   # shapes do not match: it raises
    return scores, scores
''',
}


def _write_wrong_answers(path: Path) -> None:
    """notebooks/02 with two wrong answers in place of the stubs."""
    nb = json.loads((ROOT / "notebooks" / "02_ring_attention.ipynb").read_text(encoding="utf-8"))
    done = set()
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        for head, answer in WRONG_CELLS.items():
            if cell["cell_type"] == "code" and src.startswith(head):
                cell["source"] = answer
                done.add(head)
    assert done == set(WRONG_CELLS), done
    path.write_text(json.dumps(nb), encoding="utf-8")


def _self_study_notebook() -> str:
    from lesson10.course import selfstudy
    from lesson10.course.build import plan
    return selfstudy.files(plan(ROOT))["notebooks/03_load_balance.ipynb"]


def _expected_figures(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            found += FIGURE_CALL.findall("".join(cell["source"]))
    return found


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"no Chromium at {CHROMIUM}: `sudo apt-get install chromium` (Debian/Ubuntu) or set "
            f"LESSON10_CHROMIUM=/path/to/chrome; .ci/run installs it")
    try:
        from playwright import sync_api
    except ImportError:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "no playwright: pip install -e '.[frontends]' (make test-frontends does)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=list(FRONTENDS))
def server(request, tmp_path_factory):
    name, spec = request.param, FRONTENDS[request.param]
    python = spec["python"]
    if not python.exists():
        pytest.skip(f"{python} missing: `make test-frontends` builds .venv and .venv-colab")
    versions = subprocess.run([str(python), "-c", f"import ipywidgets, {spec['module']} as app; "
                               "print(app.__version__, ipywidgets.__version__)"],
                              capture_output=True, text=True, timeout=120).stdout.split()
    assert len(versions) == 2, f"{python}: cannot import {spec['module']} and ipywidgets"
    assert versions[0].startswith(spec["version"]), f"{name}: {spec['module']} {versions[0]}, want {spec['version']}x"
    assert versions[1].startswith(spec["ipywidgets"]), f"{name}: ipywidgets {versions[1]}, want {spec['ipywidgets']}"
    home = tmp_path_factory.mktemp(name)
    work = home / "work"
    work.mkdir()
    for path in NOTEBOOKS:
        shutil.copy(path, work / path.name)
    _write_wrong_answers(work / WRONG_NOTEBOOK)
    (work / SELF_STUDY).write_text(_self_study_notebook(), encoding="utf-8")
    (work / ONE_FIGURE).write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": "from lesson10 import figures\nfigures.sp_strip()"}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 4}), encoding="utf-8")
    settings = home / "lab-settings"
    for ext, file, value in [("notebook-extension", "tracker", {"windowingMode": "none"}),   # every cell in the DOM
                             ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False})]:
        (settings / "@jupyterlab" / ext).mkdir(parents=True, exist_ok=True)
        (settings / "@jupyterlab" / ext / f"{file}.jupyterlab-settings").write_text(json.dumps(value))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "VIRTUAL_ENV", "LESSON10_STRICT"))}     # a student's kernel
    env.update(PYTHONPATH=str(ROOT), MPLBACKEND="Agg", JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"), IPYTHONDIR=str(home / "ipython"),
               PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
    port, token = _free_port(), secrets.token_hex(16)
    prefix = "ServerApp" if spec["app"] == "lab" else "NotebookApp"
    cmd = [str(python), "-m", "jupyter", spec["app"], "--no-browser", "--allow-root", f"--{prefix}.ip=127.0.0.1",
           f"--{prefix}.port={port}", f"--{prefix}.port_retries=0", f"--{prefix}.token={token}",
           f"--{prefix}.{'root_dir' if spec['app'] == 'lab' else 'notebook_dir'}={work}"]
    log = open(home / "server.log", "w")        # noqa: SIM115 - the server writes it until teardown closes it
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"{name} server exited: {(home / 'server.log').read_text()[-2000:]}"
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, f"{name} server not up in 120 s"
                time.sleep(1)
        yield {"name": name, "base": base, "token": token, "log": home / "server.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


# --------------------------------------------------------------------------- driving each frontend
LAB_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"          # the notebook in the current tab


def _run_all_lab(page, base, token, name):
    # a workspace of its own, reset: no tab of an earlier notebook comes back
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}&reset")
    page.wait_for_selector(f"{LAB_PANEL} .jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_function("() => document.querySelector('.jp-Notebook-ExecutionIndicator, "
                           ".jp-KernelStatus') !== null && document.body.innerText.includes('Idle')",
                           timeout=90_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    _wait_for_cells(page, """() => [...document.querySelectorAll('LAB_PANEL .jp-CodeCell .jp-InputPrompt')]
                                   .map(e => e.textContent.trim())
                                   .map(s => /^\\[\\d+\\]:$/.test(s) ? 'done' : s.includes('*') ? 'running' : 'waiting')
                                   """.replace("LAB_PANEL", LAB_PANEL), name)
    return f"{LAB_PANEL} .jp-OutputArea-output"


def _wait_for_cells(page, states_js, name, timeout=600, stalled=20):
    """Wait until every code cell ran ('done'); fail when none runs and some never ran for
    ``stalled`` seconds (a cell raised and the run stopped), or after ``timeout`` seconds."""
    start = last_busy = time.monotonic()
    while True:
        states = page.evaluate(states_js)
        if states and all(s == "done" for s in states):
            return
        now = time.monotonic()
        if "running" in states:
            last_busy = now
        assert now - last_busy < stalled, (
            f"{name}: the run stopped with {states.count('waiting')} of {len(states)} cells not run; "
            f"page text:\n{page.inner_text('body')[-3000:]}")
        assert now - start < timeout, f"{name}: cells still running after {timeout} s"
        time.sleep(1)


def _run_all_notebook6(page, base, token, name):
    page.goto(f"{base}/notebooks/{name}?token={token}")
    # connected, and the widget extension has registered its comm target (else the first
    # widgets arrive before their manager and show as text)
    page.wait_for_function("() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel "
                           "&& Jupyter.notebook.kernel.is_connected() "
                           "&& 'jupyter.widget' in Jupyter.notebook.kernel.comm_manager.targets",
                           timeout=90_000, polling=500)
    # widgetsnbextension 3.6 first loads the kernel's widgets: it asks the "jupyter.widget.control"
    # comm (ipywidgets 7.7 has none), then re-opens every model the kernel lists; a widget created
    # during that load is re-opened and closed, and its view hidden. Let the load finish first
    # (6 s on an idle machine; longer in proportion on a busy one).
    time.sleep(6 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    page.evaluate("() => Jupyter.notebook.execute_all_cells()")
    _wait_for_cells(page, """() => Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code')
                                   .map(c => typeof c.input_prompt_number === 'number' ? 'done'
                                             : c.input_prompt_number === '*' ? 'running' : 'waiting')""", name)
    return ".output_subarea"


def _shut_down_kernels(base, token):
    """Delete every session (and so its kernel) of the server: one live kernel at a time."""
    headers = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions", headers=headers), timeout=30) as r:
        sessions = json.load(r)
    for s in sessions:
        req = urllib.request.Request(f"{base}/api/sessions/{s['id']}", headers=headers, method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()


def _move_one_control(view):
    """Click a button that is not the active choice; with none, pick another dropdown option.
    Returns what it did, for the failure message."""
    buttons = view.locator("button:not(.mod-active):not([disabled])")
    if buttons.count():
        label = buttons.first.inner_text()
        buttons.first.click()
        return f"clicked {label!r}"
    select = view.locator("select").first
    options = select.locator("option").all_inner_texts()
    current = select.input_value()
    other = next(o for o in options if o != current)
    select.select_option(label=other)
    return f"chose {other!r} in a dropdown"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figures_render_and_respond(browser, server, path):
    expected = _expected_figures(path)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        run_all = _run_all_lab if server["name"] == "lab" else _run_all_notebook6
        output_sel = run_all(page, server["base"], server["token"], path.name)
        body = page.inner_text("body")
        assert "Error displaying widget" not in body
        assert "Traceback" not in body, body[body.index("Traceback") - 200:][:2000]
        views = page.locator(f"{output_sel}:has(img.widget-image)")
        deadline = time.monotonic() + 60                      # widget views render after their cell ends
        while views.count() < len(expected) and time.monotonic() < deadline:
            time.sleep(0.5)
        if views.count() != len(expected):
            shown = [text[:300] for text in page.locator(output_sel).all_inner_texts()
                     if re.search(r"Box|widget|Error", text)]
            pytest.fail(f"{path.name} in {server['name']}: {views.count()} figure views, want {len(expected)} "
                        f"({expected}); outputs that mention widgets: {shown}; "
                        f"server log: {server['log'].read_text()[-1500:]}")
        SHOTS.mkdir(parents=True, exist_ok=True)
        for i, figure in enumerate(expected):
            view = views.nth(i)
            view.scroll_into_view_if_needed()
            image = view.locator("img.widget-image").first
            size = image.evaluate("i => [i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width]")
            assert min(size) > 0, f"{figure}: empty image {size}"
            shot = SHOTS / (f"{figure}.png" if server["name"] == "lab" else f"{server['name']}-{figure}.png")
            if i == expected.index(figure):                  # first view of each figure in this notebook
                view.screenshot(path=str(shot))
            before = image.screenshot()
            did = _move_one_control(view)
            deadline = time.monotonic() + 60
            while image.screenshot() == before:
                assert time.monotonic() < deadline, f"{figure} in {server['name']}: {did}, the image did not change"
                time.sleep(0.5)
        assert "Error displaying widget" not in page.inner_text("body")
    finally:
        page.close()
        _shut_down_kernels(server["base"], server["token"])


def test_a_failed_check_reads_like_a_tutor(browser, server):
    """Wrong answers: the run reaches the end; the check outputs say what differs, where and
    a hint; no course file or line shows; the raising answer shows its own cell's traceback."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        run_all = _run_all_lab if server["name"] == "lab" else _run_all_notebook6
        output_sel = run_all(page, server["base"], server["token"], WRONG_NOTEBOOK)
        outputs = page.locator(output_sel).all_inner_texts()
        merge = [t for t in outputs if t.lstrip().startswith("check_merge")]
        assert len(merge) == 1, outputs
        text = merge[0]
        assert re.search(r"check_merge failed: large lse \(about \+800\).*: lse differs at query \d+, "
                         r"head \d+", text), text
        assert "yours : inf" in text and "target:" in text, text
        assert "hint: your merge has no max shift: exp overflows" in text, text
        block = [t for t in outputs if t.lstrip().startswith("check_block_attention")]
        assert len(block) == 1, outputs
        assert "check_block_attention failed: block_attention raised ValueError" in block[0], block[0]
        assert "Traceback of your code" in block[0] and "scores = q @ k.T" in block[0], block[0]
        body = page.inner_text("body")
        assert body.count("Traceback") == 1, body[body.index("Traceback") - 200:][:3000]
        for course in ("lesson10/checks", "lesson10/sim", "site-packages", "core.py", "feedback.py"):
            assert course not in body, (course, body[body.index(course) - 500:][:1500])
        assert "did not pass check_merge above" in body         # the reference stands in, it says so
        views = page.locator(f"{output_sel}:has(img.widget-image)")
        expected = _expected_figures(ROOT / "notebooks" / "02_ring_attention.ipynb")
        deadline = time.monotonic() + 60
        while views.count() < len(expected) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert views.count() == len(expected), (views.count(), expected)
        assert "Error displaying widget" not in page.inner_text("body")
    finally:
        page.close()
        _shut_down_kernels(server["base"], server["token"])


def test_a_self_study_fold_is_closed_and_opens_on_a_click(browser, server):
    """The self-study edition's folds (lesson10.course.selfstudy): closed when the notebook
    opens, the code hidden; a click on "Solution" shows the solved cell's code, whole."""
    from lesson10.course import selfstudy
    nb = json.loads(_self_study_notebook())
    codes = [selfstudy.fold_code("".join(c["source"])) for c in nb["cells"] if "lesson10" in c["metadata"]]
    assert codes and None not in codes
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        if server["name"] == "lab":
            page.goto(f"{server['base']}/lab/workspaces/selfstudy/tree/{SELF_STUDY}?token={server['token']}&reset")
            folds = page.locator(f"{LAB_PANEL} .jp-RenderedMarkdown details")
        else:
            page.goto(f"{server['base']}/notebooks/{SELF_STUDY}?token={server['token']}")
            folds = page.locator(".text_cell_render details")
        deadline = time.monotonic() + 90
        while folds.count() < len(codes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert folds.count() == len(codes), (server["name"], folds.count(), len(codes))
        for i, code in enumerate(codes):
            fold = folds.nth(i)
            fold.scroll_into_view_if_needed()
            assert fold.evaluate("d => d.open") is False, (server["name"], i)
            assert fold.locator("summary").inner_text().strip() == selfstudy.SUMMARY
            assert not fold.locator("pre").is_visible(), (server["name"], i)
            fold.locator("summary").click()
            assert fold.evaluate("d => d.open") is True, (server["name"], i)
            assert fold.locator("pre").is_visible()
            assert fold.locator("pre").inner_text().rstrip("\n") == code, (server["name"], i)
    finally:
        page.close()
        _shut_down_kernels(server["base"], server["token"])


def test_a_live_figure_shows_its_widget_not_its_static_png(browser, server):
    """The figure's display also carries a PNG for frontends without widgets
    (lesson10.figures.kit.static_bundle); a frontend that runs widgets shows the widget alone."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        run_all = _run_all_lab if server["name"] == "lab" else _run_all_notebook6
        output_sel = run_all(page, server["base"], server["token"], ONE_FIGURE)
        views = page.locator(f"{output_sel}:has(img.widget-image)")
        deadline = time.monotonic() + 60
        while views.count() < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert views.count() == 1, page.inner_text("body")[-2000:]
        static = page.locator(".jp-RenderedImage, .output_png")
        assert static.count() == 0, (server["name"], static.count())
        assert "interactive figure" not in page.inner_text("body")
    finally:
        page.close()
        _shut_down_kernels(server["base"], server["token"])
