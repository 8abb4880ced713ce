"""The overview at any depth, end to end: ``mltrace tensorboard`` (a real TensorBoard process on
127.0.0.1) and headless Debian Chromium at 1600x1000, as the user who found it, on a 100-layer
MLP the PyTorch hook recorded (202 gradients, 20 steps) and a GPT-2-style Transformers model (148
gradients): rows in model order, a readable label
on every row of a grid that scrolls, layers that fold, the readout at the pointer, two runs side
by side on one colour scale, sections of one kind in "(all tensors)", the normalizations, and the
difference view that marks where two runs part ways.

Screenshots are kept in test-artifacts/ (git-ignored): tb_overview_depth*.png.
"""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from mltrace.analysis.order import model_order
from mltrace.trials import create_trial
from tests.support.browser import headless_chromium
from tests.tb_plugin.test_tb_browser import _open_tab, _runs, _shot, mltrace_tensorboard
from tests.tb_plugin.test_tb_overview_depth import LINEAR, make_gpt2_trial, make_mlp_trial

#: The gradients in model order: input layer first (each layer's bias, weight), output last.
ORDER = [f"gradient/Sequential_{2 * k}.{p}" for k in range(LINEAR) for p in ("bias", "weight")]
MID_RATIO = [255, 240, 168]  # the diverging scale's colour of ×1 (#fff0a8)
#: mlp_bumped: Linear layer 60's weights made 1.5 times larger just before step 8
BUMP = (60, 8)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """The MLP, and the same MLP whose back-propagated loss is 100 times larger: its gradients
    at step 0 are exactly 100 times the first run's."""
    root = tmp_path_factory.mktemp("depth_tb")
    make_mlp_trial(root / "exp" / "mlp")
    make_mlp_trial(root / "exp" / "mlp_loud", loss_scale=100.0)
    make_mlp_trial(root / "exp" / "mlp_bumped", bump=BUMP)
    make_gpt2_trial(root / "exp" / "gpt2")
    return root


@pytest.fixture(scope="module")
def server(logs):
    with mltrace_tensorboard(logs, runs=4) as url:  # no TensorBoard export: the tab lists them
        yield url


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(1600, 1000) as driver:
        yield driver


def _canvases(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".mt-ov-canvas")


def _wait_rows(wait, rows: int, runs: int = 1):
    """Until the overview shows ``rows`` rows of ``runs`` runs and the first run's diagnosis is
    in (a diagnosis that found something redraws the grid with its marks)."""
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#mt-diagnosis[data-found]"))
    wait.until(lambda d: len(_canvases(d)) == runs and all(
        c.get_attribute("data-rows") == str(rows) for c in _canvases(d)))


def _rect(driver, element) -> dict:
    return driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                 "return {left: r.left, top: r.top, right: r.right, bottom: r.bottom,"
                                 " width: r.width, height: r.height};", element)


def _pixel(driver, canvas, x: int, y: int) -> list[int]:
    return driver.execute_script("return Array.from(arguments[0].getContext('2d')"
                                 ".getImageData(arguments[1], arguments[2], 1, 1).data).slice(0, 3)", canvas, x, y)


def _cell(driver, canvas, row: int, col: int) -> list[int]:
    """The colour in the middle of cell (row, col): rows are 14 px under the 12 px strip."""
    cols = int(canvas.get_attribute("data-columns"))
    width = int(canvas.get_attribute("width"))
    return _pixel(driver, canvas, int((col + 0.5) * width / cols), 12 + row * 14 + 7)


def _point(driver, x: float, y: float) -> None:
    """The pointer to (x, y) of the tab's frame (pointer actions take the page's coordinates:
    the frame's offset in TensorBoard's page is added)."""
    driver.switch_to.default_content()
    frame = driver.find_elements(By.CSS_SELECTOR, "iframe")[0]
    at = _rect(driver, frame)
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(round(at["left"] + x), round(at["top"] + y))
    actions.perform()
    driver.switch_to.frame(frame)


def _luminance(rgb: list[int]) -> float:
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]


def _visible(driver, label) -> bool:
    """Whether ``label`` is inside the scrolling box's view and the window, on top (not hidden
    under anything), at least 12 px tall and wide enough to read."""
    return driver.execute_script("""
        const el = arguments[0], box = document.getElementById('mt-ov-scroll');
        const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
        const x = r.left + Math.min(r.width / 2, 40), y = r.top + r.height / 2;
        const hit = document.elementFromPoint(x, y);
        return r.height >= 12 && r.width >= 150 && r.top >= b.top && r.bottom <= b.bottom
            && r.bottom <= window.innerHeight && r.right <= window.innerWidth && hit !== null && el.contains(hit);
    """, label)


def test_a_100_layer_model_in_model_order_with_a_readable_label_on_every_row(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "mlp")
    _wait_rows(wait, len(ORDER))
    canvas = _canvases(browser)[0]
    assert int(canvas.get_attribute("height")) == 12 + 14 * len(ORDER)  # 14 px a row at 202 rows
    labels = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")
    tensors = [e.get_attribute("data-tensor") for e in labels]
    assert tensors == ORDER  # model order: the input layer first, not Sequential_0, _10, _100
    assert tensors.index("gradient/Sequential_2.weight") < tensors.index("gradient/Sequential_10.weight")
    # the common prefix is said once above the grid; each label is the rest of its name, 14 px tall
    assert browser.find_element(By.ID, "mt-ov-prefix").text == "gradient/…"
    shown = browser.execute_script("return Array.from(document.querySelectorAll('.mt-ov-label'), (e) =>"
                                   " [e.querySelector('.mt-ov-name').textContent, e.offsetHeight])")
    assert shown == [[t.removeprefix("gradient/"), 14] for t in ORDER]
    box = browser.find_element(By.ID, "mt-ov-scroll")
    assert browser.execute_script("return arguments[0].scrollHeight > arguments[0].clientHeight + 1000", box)
    for k in (0, 1, 57, 100, 150, len(ORDER) - 1):  # readable wherever the grid is scrolled to
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", labels[k])
        assert _visible(browser, labels[k]), k
        assert labels[k].find_element(By.CSS_SELECTOR, ".mt-ov-name").text == ORDER[k].removeprefix("gradient/"), k
    # the labels stay beside their rows: a label's middle is its row's middle on the canvas
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", labels[150])
    middle = _rect(browser, labels[150])["top"] + 7 - _rect(browser, canvas)["top"]
    assert abs(middle - (12 + 150 * 14 + 7)) <= 2
    _shot(browser, "tb_overview_depth.png")


def test_a_gpt2_style_model_in_model_order_with_its_blocks_and_a_label_on_every_row(server, browser, logs):
    """GPT-2 small's 148 gradients, as the issue's user saw them: in model order (embeddings,
    h.0 .. h.11 in their order, not h.0, h.1, h.10, the final norm), folded by block, the long
    shared prefix said once and each row named by the rest."""
    trial = create_trial(str(logs / "exp" / "gpt2"))
    order = model_order(trial, trial.tensor_names(collection="gradients"))
    prefix = "gradient/GPT2LMHeadModel_transformer."
    wait = _open_tab(browser, server)
    _runs(browser, "gpt2")
    _wait_rows(wait, 148)
    labels = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")
    tensors = [e.get_attribute("data-tensor") for e in labels]
    assert tensors == order and len(tensors) == 148
    blocks = [int(t.split(".h.")[1].split(".")[0]) for t in tensors if ".h." in t]
    assert blocks == sorted(blocks) and blocks[-1] == 11  # h.2 before h.10, h.11 last
    assert tensors[0] == prefix + "wte.weight" and tensors[-1].startswith(prefix + "ln_f.")
    assert browser.find_element(By.ID, "mt-ov-prefix").text == prefix + "…"
    shown = browser.execute_script("return Array.from(document.querySelectorAll('.mt-ov-label'), (e) =>"
                                   " [e.querySelector('.mt-ov-name').textContent, e.offsetHeight])")
    assert shown == [[t.removeprefix(prefix), 14] for t in order]
    for k in (0, 70, 147):
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", labels[k])
        assert _visible(browser, labels[k]), k
    # one group a block: "collapse layers" shows the model in a screenful of lines
    browser.find_element(By.ID, "mt-ov-collapse").click()
    wait.until(lambda d: int(_canvases(d)[0].get_attribute("data-lines")) < 20)
    groups = [g.text.split("\n")[-1] for g in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-group")]
    assert groups == [f"h.{k} (12 tensors)" for k in range(12)] + ["ln_f (2 tensors)"]
    assert _canvases(browser)[0].get_attribute("data-lines") == "15"  # wte, wpe and 13 groups
    _shot(browser, "tb_overview_depth_gpt2.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.ID, "mt-ov-expand").click()


def test_the_readout_follows_the_pointer_and_stays_in_view(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "mlp")
    _wait_rows(wait, len(ORDER))
    canvas = _canvases(browser)[0]
    tip = browser.find_element(By.ID, "mt-ov-tip")
    box = browser.find_element(By.ID, "mt-ov-scroll")
    browser.execute_script("arguments[0].scrollTop = arguments[0].scrollHeight", box)  # the bottom rows
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", box)  # the box's bottom in view
    seen = []
    for row, dx in ((len(ORDER) - 3, -0.4), (len(ORDER) - 1, 0.45), (len(ORDER) - 30, 0.0)):
        c = _rect(browser, canvas)
        x, y = c["left"] + c["width"] * (0.5 + dx), c["top"] + 12 + row * 14 + 7
        _point(browser, x, y)
        wait.until(lambda d, row=row: ORDER[row] in tip.text)
        t = _rect(browser, tip)
        assert t["width"] > 0 and 0 <= t["left"] and t["right"] <= browser.execute_script("return innerWidth")
        assert 0 <= t["top"] and t["bottom"] <= browser.execute_script("return innerHeight")
        # beside the pointer: within 40 px of it, on whichever side it fits
        assert min(abs(t["left"] - x), abs(t["right"] - x)) <= 40 and min(abs(t["top"] - y), abs(t["bottom"] - y)) <= 40
        seen.append((round(t["left"]), round(t["top"])))
        assert f"{ORDER[row]} · mlp · step" in tip.text and "l2" in tip.text
    assert len(set(seen)) == 3  # it moved with the pointer
    _shot(browser, "tb_overview_depth_readout.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "mt-ov-info")).perform()
    wait.until(lambda d: not tip.is_displayed())  # gone when the pointer leaves the grid


def test_layers_fold_into_one_line_and_unfold(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "mlp")
    _wait_rows(wait, len(ORDER))
    first = browser.find_element(By.CSS_SELECTOR, ".mt-ov-label .mt-ov-toggle")
    first.click()  # Sequential_0's bias and weight become one line
    wait.until(lambda d: _canvases(d)[0].get_attribute("data-lines") == str(len(ORDER) - 1))
    group = browser.find_element(By.CSS_SELECTOR, ".mt-ov-group")
    assert group.find_element(By.CSS_SELECTOR, ".mt-ov-name").text == "Sequential_0 (2 tensors)"
    assert browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")[0].get_attribute("data-tensor") == ORDER[2]
    browser.find_element(By.ID, "mt-ov-collapse").click()  # every layer: one line per layer, 101 lines
    wait.until(lambda d: _canvases(d)[0].get_attribute("data-lines") == str(LINEAR))
    groups = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-group")
    names = [g.find_element(By.CSS_SELECTOR, ".mt-ov-name").text for g in groups[:3]]
    assert names == [f"Sequential_{k} (2 tensors)" for k in (0, 2, 4)]
    # a folded line shows its layer's largest values: the weight's l2 (above the bias') colours it
    canvas = _canvases(browser)[0]
    assert _cell(browser, canvas, 100, 0) != _cell(browser, canvas, 0, 0)  # vanishing with depth
    _shot(browser, "tb_overview_depth_folded.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    browser.find_element(By.ID, "mt-ov-expand").click()
    wait.until(lambda d: _canvases(d)[0].get_attribute("data-lines") == str(len(ORDER)))


def test_two_runs_side_by_side_on_one_colour_scale(server, browser):
    """The second run's gradients at step 0 are exactly 100 times the first's. On one scale
    each of its cells is brighter; on a scale of its own (the bug) each would be the same
    colour as the first run's."""
    wait = _open_tab(browser, server)
    _runs(browser, "mlp", "mlp_loud")
    _wait_rows(wait, len(ORDER), runs=2)
    first, loud = _canvases(browser)
    assert [first.get_attribute("data-run"), loud.get_attribute("data-run")] == ["mlp", "mlp_loud"]
    assert first.get_attribute("data-scales") == loud.get_attribute("data-scales")
    scales = json.loads(first.get_attribute("data-scales"))
    assert list(scales) == ["gradients"] and scales["gradients"]["type"] == "log"
    assert len(browser.find_elements(By.CSS_SELECTOR, ".mt-ov-scale")) == 1  # one colour bar
    assert "one scale for 2 runs" in browser.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text
    assert _rect(browser, first)["top"] == _rect(browser, loud)["top"]  # side by side
    for row in (0, 50, 101, len(ORDER) - 1):
        a, b = _cell(browser, first, row, 0), _cell(browser, loud, row, 0)
        assert _luminance(b) > _luminance(a) + 5, (row, a, b)
    _shot(browser, "tb_overview_depth_two_runs.png")
    # relative to the first step: step 0 is ×1 in both runs, whatever their sizes
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    Select(browser.find_element(By.ID, "mt-ov-normalize")).select_by_value("first")
    wait.until(lambda d: "relative to its first step" in d.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text)
    _wait_rows(wait, len(ORDER), runs=2)
    first, loud = _canvases(browser)
    assert json.loads(first.get_attribute("data-scales"))["gradients"]["type"] == "ratio"
    for canvas in (first, loud):
        for row in (0, 101, len(ORDER) - 1):
            assert all(abs(p - q) <= 2 for p, q in zip(_cell(browser, canvas, row, 0), MID_RATIO)), row
    Select(browser.find_element(By.ID, "mt-ov-normalize")).select_by_value("none")
    wait.until(lambda d: "bucket maximum" in d.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text)


def test_all_tensors_weights_and_gradients_never_share_a_scale(server, browser):
    wait = _open_tab(browser, server)
    _runs(browser, "mlp")
    _wait_rows(wait, len(ORDER))
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value("")
    wait.until(lambda d: _canvases(d) and _canvases(d)[0].get_attribute("data-rows") == str(4 * LINEAR + 1))
    sections = [s.get_attribute("data-kind") for s in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-section")]
    assert sections == ["gradients", "weights", "biases", "losses"]
    bars = {b.get_attribute("data-kind"): json.loads(b.get_attribute("data-scale"))
            for b in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-scale")}
    assert list(bars) == sections and bars["weights"] != bars["gradients"]
    assert bars["gradients"]["decades"][0] <= -5 and bars["weights"]["decades"][1] >= 1
    # each section's rows in model order, under its header
    labels = [e.get_attribute("data-tensor") for e in browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label")]
    assert labels[:len(ORDER)] == ORDER and labels[len(ORDER)] == "Sequential_0.weight"
    _shot(browser, "tb_overview_depth_all.png")


def test_the_difference_view_marks_the_layer_that_was_made_to_differ(server, browser):
    """mlp_bumped is mlp but for one layer's weights, made 1.5 times larger just before step 8.
    Over mlp, its weights are ×1 everywhere before that step; the line where the runs part ways
    stands at step 8 and the changed layer's row and label are marked."""
    bumped = f"Sequential_{2 * BUMP[0]}.weight"
    wait = _open_tab(browser, server)
    _runs(browser, "mlp", "mlp_bumped")
    _wait_rows(wait, len(ORDER), runs=2)
    Select(browser.find_element(By.ID, "mt-ov-collection")).select_by_value("weights")
    wait.until(lambda d: _canvases(d) and _canvases(d)[0].get_attribute("data-rows") == str(LINEAR))
    Select(browser.find_element(By.ID, "mt-ov-compare")).select_by_value("ratio")
    wait.until(lambda d: len(_canvases(d)) == 1 and _canvases(d)[0].get_attribute("data-against") == "mlp")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".mt-diag-line.mt-onset"))
    canvas = _canvases(browser)[0]
    assert canvas.get_attribute("data-run") == "mlp_bumped"
    assert "mlp_bumped ÷ mlp" in browser.find_element(By.CSS_SELECTOR, ".mt-ov-runname").text
    line = browser.find_element(By.CSS_SELECTOR, ".mt-diag-line.mt-onset")
    assert line.get_attribute("data-step") == str(BUMP[1]) and "parts ways" in line.get_attribute("title")
    marked = browser.find_elements(By.CSS_SELECTOR, ".mt-ov-label.mt-origin")
    assert [m.get_attribute("data-tensor") for m in marked] == [bumped]
    assert _visible(browser, marked[0])  # scrolled to: row 60 of 101 is below the fold at first
    info = browser.find_element(By.ID, "mt-ov-info").text
    assert f"parts ways with mlp at global step {BUMP[1]} in {bumped}" in info and "×1.5" in info
    assert "each run over the first" in browser.find_element(By.CSS_SELECTOR, ".mt-ov-legend").text
    assert not browser.find_elements(By.ID, "mt-ov-normalize")  # a ratio already: no other scale
    # ×1 (the pale middle of the diverging scale) before the change and in the other layers;
    # the changed layer's row leaves it at the step
    same = lambda rgb: all(abs(p - q) <= 2 for p, q in zip(rgb, MID_RATIO))  # noqa: E731
    assert same(_cell(browser, canvas, BUMP[0], BUMP[1] - 1)) and same(_cell(browser, canvas, 0, BUMP[1]))
    assert not same(_cell(browser, canvas, BUMP[0], BUMP[1]))
    _shot(browser, "tb_overview_depth_difference.png")
    browser.switch_to.frame(browser.find_elements(By.CSS_SELECTOR, "iframe")[0])
    Select(browser.find_element(By.ID, "mt-ov-compare")).select_by_value("side")
    wait.until(lambda d: len(_canvases(d)) == 2)
