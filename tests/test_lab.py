"""JupyterLab as users run it: ``scripts/lab.sh`` starts JupyterLab (as root too, without
reinstalling), a real headless browser (the distribution's Chromium, driven by Selenium through the
distribution's chromedriver) opens the quickstart notebook, runs every cell on the sim, and the
figures render; the notebook's relative ``OUT`` lands under the kernel's start folder (the checkout's
root for users, so ``results/`` as the README says).

Nothing is installed from here: ``.ci/run`` installs the distribution's ``chromium`` and
``chromium-driver``, the ``selenium`` test extra and JupyterLab (``scripts/lab.sh --version`` once); where
one is missing the tests skip and say which and how to get it. Browser builds that a tool downloads for
itself are never used: the browser and driver paths are given explicitly. JupyterLab runs in its own
process group, ended when the fixture ends and, should the run be interrupted, at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"BACKEND": "sim", "PRESET": "tiny", "TOKENS": 8, "STAGES": "0,1,3"}


def _browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths; skips (saying how to install them) where they are missing."""
    b = shutil.which("chromium") or shutil.which("chromium-browser")
    d = shutil.which("chromedriver")
    if not (b and d):
        pytest.skip("no chromium/chromedriver on PATH (the distribution's packages: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    return b, d


def _selenium():
    """Selenium's webdriver (the ``test`` extra); skips where it is not installed."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    return webdriver


def _jupyterlab_ready() -> None:
    """Skip unless scripts/lab.sh will start without installing anything (JupyterLab in .venv, its stamp
    newer than pyproject.toml): a test never runs pip."""
    venv = ROOT / ".venv"
    stamp = venv / ".ds4lab-notebooks-installed"
    if not (venv / "bin" / "jupyter-lab").exists() or not stamp.exists() or \
            (ROOT / "pyproject.toml").stat().st_mtime > stamp.stat().st_mtime:
        pytest.skip("JupyterLab is not installed in .venv: run `bash scripts/lab.sh --version` once (.ci/run does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """scripts/lab.sh serving a copy of the quickstart notebook (small sim parameters) on a free port."""
    import nbformat

    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    browser, driver = _browser()
    webdriver = _selenium()
    _jupyterlab_ready()
    tmp = tmp_path_factory.mktemp("lab")
    nbs, cwd = tmp / "notebooks", tmp / "work"
    nbs.mkdir()
    cwd.mkdir()
    # papermill's own reader: it gives every cell the tags list its parameterizing looks for (cells of a
    # notebook written by jupytext carry no tags but the parameters cell's)
    nb = load_notebook_node(str(ROOT / "notebooks" / "00_quickstart.ipynb"))
    nb.metadata.pop("jupytext", None)  # a copy, not paired with the notebook's source
    nb = parameterize_notebook(nb, SMALL)  # papermill's cell after the parameters cell, as a headless run has
    nbformat.write(nb, nbs / "00_quickstart.ipynb")
    port, token = _free_port(), "ds4lab-test"
    log = open(tmp / "lab.log", "w")
    env = {**os.environ, "DS4LAB_NOTEBOOKS": str(nbs), "DS4LAB_LAB_CWD": str(cwd)}
    env.pop("JUPYTER_TOKEN", None)
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "lab.sh"), "--no-browser", f"--port={port}",
                             f"--ServerApp.token={token}", "--ServerApp.open_browser=False"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)

    atexit.register(stop)  # an interrupted run ends JupyterLab too
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 240
        while True:
            if proc.poll() is not None:
                text = (tmp / "lab.log").read_text()
                pytest.fail(f"scripts/lab.sh exited with {proc.returncode}: {text[-1500:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if time.time() > end:
                    pytest.fail(f"JupyterLab did not answer in 240 s: {(tmp / 'lab.log').read_text()[-1500:]}")
                time.sleep(1)
        opts = webdriver.ChromeOptions()
        opts.binary_location = browser
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--window-size=1400,1000"):
            opts.add_argument(a)
        from selenium.webdriver.chrome.service import Service

        drv = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
        try:
            yield {"driver": drv, "url": url, "token": token, "cwd": cwd, "log": tmp / "lab.log", "nbs": nbs}
        finally:
            drv.quit()
    finally:
        stop()
        atexit.unregister(stop)
        log.close()


def _wait(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_lab_runs_a_notebook_in_a_browser_and_its_figures_render(lab):
    from selenium.webdriver.common.by import By

    d = lab["driver"]
    d.get(f"{lab['url']}/lab/tree/00_quickstart.ipynb?token={lab['token']}")
    _wait(lambda: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell"), 90, "the notebook's cells")
    # the kernel: idle before running (the status bar says "Idle")
    _wait(lambda: "Idle" in d.find_element(By.TAG_NAME, "body").text, 90, "the kernel to start")
    run = next(m for m in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if m.text.strip() == "Run")
    run.click()
    run_all = ('li.lm-Menu-item[data-command="runmenu:run-all"], '  # JupyterLab 4's Run menu
               'li.lm-Menu-item[data-command="notebook:run-all-cells"]')
    item = _wait(lambda: d.find_elements(By.CSS_SELECTOR, run_all), 20, "the Run All Cells menu item")
    item[0].click()

    def done():
        errs = d.find_elements(By.CSS_SELECTOR, '[data-mime-type="application/vnd.jupyter.error"]')
        if errs:
            raise AssertionError(f"a cell failed in the browser: {errs[0].text[:800]}")
        prompts = [p.text.strip() for p in d.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputArea-prompt")]
        return prompts and all(p.startswith("[") and p[1:-2].strip().isdigit() for p in prompts)

    _wait(done, 150, "every cell to run")
    widths = d.execute_script("return Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
                              ".map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert widths and all(c and w > 100 and h > 100 for c, w, h in widths), widths
    text = d.find_element(By.CSS_SELECTOR, ".jp-Notebook").text
    assert "MODELED" in text  # the notebook says its figures are modeled
    # the relative OUT landed under the kernel's start folder (the checkout's root for users)
    assert (lab["cwd"] / "results" / "nb-quickstart" / "ladder.png").is_file()
    assert not (lab["nbs"] / "results").exists()


def test_lab_sh_starts_again_without_reinstalling(lab):
    """After the fixture's start (which may have installed JupyterLab), a second start installs
    nothing: ``jupyter lab --version`` through lab.sh, with the install message absent. (The fixture's
    start itself proves lab.sh runs as root where the tests run as root: JupyterLab exits when run as
    root without --allow-root.)"""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "lab.sh"), "--version"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert "installing" not in r.stderr and r.stdout.strip()[0].isdigit()
