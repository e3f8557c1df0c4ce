"""tools/python/examples/thumbnails.ipynb runs top to bottom against a real blobrefd (Debian's
nbclient and ipykernel, the kernel being Debian's /usr/bin/python3): no cell may fail, and the
thumbnails are in its outputs."""
import json
import random
import subprocess

import pytest

from conftest import ROOT

NOTEBOOK = ROOT / "tools" / "python" / "examples" / "thumbnails.ipynb"
KERNEL_PYTHON = "/usr/bin/python3"


def kernel_env(tmp_path, monkeypatch, url):
    """A kernelspec of our own whose argv is Debian's python3 (the `python3` on PATH may be
    another build without ipykernel), found through JUPYTER_PATH; private runtime dirs."""
    r = subprocess.run([KERNEL_PYTHON, "-c", "import ipykernel, PIL, IPython"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{KERNEL_PYTHON} lacks ipykernel or PIL (tools/install-deps.sh test "
                    f"installs python3-ipykernel and python3-pil): {r.stderr.strip()[-200:]}")
    spec = tmp_path / "jupyter" / "kernels" / "blobref-python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [KERNEL_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (Debian)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("BLOBREF_URL", url)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))   # the notebook's generated images
    monkeypatch.delenv("BLOBREF_TOKEN", raising=False)
    return "blobref-python3"


def run_notebook(tmp_path, kernel):
    nbformat = pytest.importorskip("nbformat", reason="python3-nbformat is not installed")
    nbclient = pytest.importorskip("nbclient", reason="python3-nbclient is not installed")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()      # raises CellExecutionError at the first failing cell
    finally:
        nbformat.write(nb, str(tmp_path / "executed.ipynb"))   # for a look after a failure
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(nb.cells)
              if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    return nb


def images_in(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type == "display_data" and "image/png" in o.get("data", {})]


def text_of(nb):
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.output_type == "stream")


def test_notebook_with_generated_images(server, tmp_path, monkeypatch):
    kernel = kernel_env(tmp_path, monkeypatch, server.url)
    nb = run_notebook(tmp_path, kernel)
    out = text_of(nb)
    assert "12 images in" in out
    assert "second pass: 0 bytes sent" in out
    assert "12 found, missing: ['" in out
    pngs = images_in(nb)
    assert len(pngs) == 12 + 1, out   # a thumbnail per image and the contact sheet
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "text/html" in o.get("data", {})]
    assert html and html[0]["data"]["text/html"].count("<tr>") == 13
    # Image.open read the headers only: one 4 KiB range of each JPEG
    assert html[0]["data"]["text/html"].count("<td>4096</td>") == 12


def test_notebook_with_a_folder(server, tmp_path, monkeypatch):
    from PIL import Image
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = random.Random(3)
    for i, fmt in enumerate(["png", "jpeg", "png", "gif", "jpeg"]):
        im = Image.new("RGB", (300 + 40 * i, 200), tuple(rng.randrange(256) for _ in range(3)))
        im.save(folder / f"p{i}.{'jpg' if fmt == 'jpeg' else fmt}", fmt.upper())
    (folder / "notes.txt").write_text("not an image")
    monkeypatch.setenv("BLOBREF_IMAGES", str(folder))
    kernel = kernel_env(tmp_path, monkeypatch, server.url)
    nb = run_notebook(tmp_path, kernel)
    assert f"5 images in {folder}" in text_of(nb)
    assert len(images_in(nb)) == 5 + 1
