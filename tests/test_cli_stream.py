"""`gpu-webhook check` reads its input as a stream: the readers yield as they read, hold only what is being
decided, and point each field path at its line and column."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest
import yaml

from tests.manifests import container, pod
from tests.test_cli import cli  # noqa: F401  (the fixture: gpu-webhook in this process)
from webhook.manifests import yamlstream
from webhook.manifests.jsonstream import JsonInput, JsonLocator
from webhook.manifests.positions import YamlLocator, steps
from webhook.manifests.yamlstream import yaml_parts

GPU = "nvidia.com/gpu"


class Counted(io.BytesIO):
    """Bytes that count what was read of them."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.served = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.served += len(data)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        data = super().readline(size)
        self.served += len(data)
        return data

    def __iter__(self):
        return iter(self.readline, b"")


def pods(count: int) -> list[dict]:
    return [pod(container("main", limits={GPU: 1}, requests={GPU: 1 if i % 10 else 2}), name=f"pod-{i}",
                nodeSelector={"accelerator": "nvidia-l4"}) for i in range(count)]


def kubectl_list(items: list[dict]) -> bytes:
    return json.dumps({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}},
                      indent=4).encode()


# ------------------------------------------------------------------------------------------ field paths

@pytest.mark.parametrize(("path", "parts"), [
    ("", ()),
    ("spec", ("spec",)),
    ("spec.containers[0].resources.limits[nvidia.com/gpu]", ("spec", "containers", "0", "resources", "limits", GPU)),
    ("spec.pytorchReplicaSpecs.Worker.template.spec", ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec")),
    ("metadata.annotations[example.com/accelerator]", ("metadata", "annotations", "example.com/accelerator")),
    ("spec.resourceClaims[0]", ("spec", "resourceClaims", "0")),
])
def test_a_field_path_is_read_back_into_its_keys_and_indexes(path, parts):
    assert steps(path) == parts


DOCUMENT = """\
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: a
    resources:
      requests: {nvidia.com/gpu: 1}
  - name: b
"""
AT = [  # (path, line, column): the field, or the closest ancestor that exists
    ("", 1, 1),
    ("spec", 4, 1),
    ("spec.containers[0].resources.requests[nvidia.com/gpu]", 8, 18),
    ("spec.containers[0].resources.limits[nvidia.com/gpu]", 7, 5),  # no limits: at resources
    ("spec.containers[1].resources", 9, 5),  # no resources: at the container
    ("spec.containers[5].name", 5, 3),  # no such container: at containers
    ("metadata.name", 3, 12),
]


@pytest.mark.parametrize(("path", "line", "column"), AT, ids=[a[0] or "root" for a in AT])
def test_a_path_points_at_its_field_in_yaml(path, line, column):
    node = yaml.compose(DOCUMENT, yaml.SafeLoader)
    assert YamlLocator(node).at(steps(path)) == (line, column)


JSON_DOCUMENT = json.dumps(yaml.safe_load(DOCUMENT), indent=1)
JSON_AT = [  # (path, the text where it points: a key, or the start of a list item)
    ("", "{"),
    ("spec.containers[0].resources.requests[nvidia.com/gpu]", f'"{GPU}"'),
    ("spec.containers[0].resources.limits[nvidia.com/gpu]", '"resources"'),  # no limits: at resources
    ("spec.containers[1].resources", '{\n    "name": "b"'),  # no resources: at the container
    ("spec.containers[5].name", '"containers"'),  # no such container: at containers
]


@pytest.mark.parametrize(("path", "needle"), JSON_AT, ids=[a[0] or "root" for a in JSON_AT])
def test_a_path_points_at_its_field_in_json(path, needle):
    [part] = list(JsonInput(io.BytesIO(JSON_DOCUMENT.encode())).parts())
    assert isinstance(part.locator, JsonLocator)
    at = JSON_DOCUMENT.index(needle)
    line, column = JSON_DOCUMENT.count("\n", 0, at) + 1, at - JSON_DOCUMENT.rfind("\n", 0, at)
    assert part.locator.at(steps(path)) == (line, column)


def test_yaml_first_lines_are_the_files():
    node = yaml.compose(DOCUMENT, yaml.SafeLoader)
    assert YamlLocator(node, first_line=10).at(steps("spec")) == (14, 1)


# ------------------------------------------------------------------------------------------ JSON, read on

@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_a_json_list_read_in_any_chunks_is_what_json_loads_reads(chunk):
    """The sliding buffer: items, a number and a string cut by a chunk's end, escapes, non-ASCII."""
    items = pods(5) + [{"kind": "Pod", "metadata": {"name": "ünïcødé \\u00e9 \"q\""}, "x": 12345.678e3}]
    data = kubectl_list(items) + b'\n{"kind": "Pod", "n": 1234567}\n'
    parts = list(JsonInput(io.BytesIO(data), chunk=chunk).parts())
    assert [p.kind for p in parts] == ["item"] * 6 + ["list", "document"]
    assert [p.value for p in parts[:6]] == items
    assert parts[6].value == {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}}
    assert parts[6].more and parts[7].value == {"kind": "Pod", "n": 1234567} and not parts[7].more


def test_top_level_numbers_cut_by_a_chunk_are_read_whole():
    assert [p.value for p in JsonInput(io.BytesIO(b"12345 678"), chunk=2).parts()] == [12345, 678]


def test_a_json_list_yields_its_first_item_before_the_rest_is_read():
    data = kubectl_list(pods(5000))
    stream = Counted(data)
    parts = JsonInput(stream, chunk=64 * 1024).parts()
    first = next(parts)
    assert first.kind == "item" and first.value["metadata"]["name"] == "pod-0"
    assert stream.served <= 128 * 1024 < len(data) // 10


def test_yaml_documents_are_read_one_at_a_time():
    data = yaml.safe_dump_all(pods(5000)).encode()
    stream = Counted(data)
    parts = yaml_parts(stream)
    first = next(parts)
    assert first.kind == "document" and first.value["metadata"]["name"] == "pod-0" and first.more
    assert stream.served < 64 * 1024 < len(data) // 10


CHUNK = 64 * 1024


def _peak(read) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_holds_one_item_not_the_file():
    """Peak memory while every object of a 2 MB input is read stays a fraction of the input; loading the same
    List whole (the control) takes several times the input."""
    items = pods(3000)
    listing, documents = kubectl_list(items), yaml.safe_dump_all(items).encode()
    yaml_listing = kubectl_yaml_list(items).encode()
    assert len(listing) > 2_000_000 and len(documents) > 700_000

    def whole() -> None:
        json.loads(listing)

    def by_item() -> None:
        count = sum(p.kind == "item" for p in JsonInput(io.BytesIO(listing), chunk=CHUNK).parts())
        assert count == len(items)

    def by_document() -> None:
        assert sum(1 for _ in yaml_parts(io.BytesIO(documents))) == len(items)

    def by_yaml_item() -> None:
        assert sum(p.kind == "item" for p in yaml_parts(io.BytesIO(yaml_listing))) == len(items)

    assert _peak(whole) > len(listing)
    assert _peak(by_item) < min(8 * CHUNK, len(listing) // 4)  # a few chunks: the text held, what is read on
    assert _peak(by_document) < len(documents) // 4
    assert _peak(by_yaml_item) < len(yaml_listing) // 4


# ------------------------------------------------------------------------------------------ broken input

@pytest.mark.parametrize(("data", "says"), [
    (b'{"apiVersion": "v1", "items": [{"kind": "Pod"},\n  ], "kind": "List"}',
     "invalid JSON: trailing comma is not allowed (line 1, column 47)"),
    (b'{"apiVersion": "v1", "items": [{"kind": "Pod"}\n  {"kind": "Pod"}]}',
     "invalid JSON: expected ',' or ']' (line 2, column 3)"),
    (b'{"apiVersion": "v1", "items": [{"kind": "Pod"}, {"kind": "Pod",}]}', "invalid JSON: "),
    (b'{"apiVersion": "v1", "items": [{"kind": "Pod"}', "invalid JSON: unexpected end of data"),
], ids=["trailing comma", "missing comma", "broken item", "cut short"])
def test_a_broken_list_is_named_where_it_breaks_after_the_items_before_it(data, says):
    parts = list(JsonInput(io.BytesIO(data), chunk=16).parts())
    assert parts[0].kind == "item" and parts[0].value == {"kind": "Pod"}
    assert parts[-1].kind == "problem" and str(parts[-1].value).startswith(says), parts[-1].value


def test_bytes_that_are_not_utf8_are_named_at_their_offset_in_the_file(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.json"
    good = kubectl_list(pods(50))
    path.write_bytes(good[:-200] + b"\xff" + good[-199:])
    code, _, err = cli("check", str(path))
    before = good[:-200]
    line, column = before.count(b"\n") + 1, len(before) - before.rfind(b"\n")
    assert code == 2 and err[0] == f"{path}: not UTF-8: byte 0xff at line {line}, column {column}: save it as UTF-8"


def test_a_list_item_without_kind_in_the_first_of_several_documents_is_named_by_document(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.json"
    path.write_text('{"apiVersion": "v1", "items": [{"metadata": {}}], "kind": "List"}\n{"kind": "Pod"}\n')
    code, _, err = cli("check", str(path))
    assert code == 2 and err[0] == f"{path}: document 1: item 1 is not a Kubernetes object (no kind)"



# ------------------------------------------------------------------------------------------ YAML Lists

def kubectl_yaml_list(items: list[dict]) -> str:
    """As kubectl get -o yaml writes a List: apiVersion, items, kind, metadata."""
    return yaml.safe_dump({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}})


def test_a_yaml_list_is_read_item_by_item_and_each_field_is_where_it_is(cli, tmp_path):  # noqa: F811
    items = [pod(container("a", limits={GPU: 1}), name="ok"), pod(container("a", requests={GPU: 1}), name="bad"),
             {"apiVersion": "v1", "kind": "List", "items": [pod(container("a", limits={GPU: "0.5"}), name="inner")]}]
    text = kubectl_yaml_list(items)
    assert [p.kind for p in yaml_parts(io.BytesIO(text.encode()))] == ["item", "item", "item", "list"]
    big = kubectl_yaml_list(pods(3000)).encode()
    stream = Counted(big)
    parts = yaml_parts(stream)
    first = next(parts)
    assert first.kind == "item" and first.value["metadata"]["name"] == "pod-0"
    assert stream.served < 64 * 1024 < len(big) // 10
    path = tmp_path / "list.yaml"
    path.write_text(text)
    code, out, _ = cli("check", "-o", "jsonl", str(path))
    lines = text.splitlines()
    requests = next(n for n, line in enumerate(lines, 1) if "requests:" in line) + 1
    half = next(n for n, line in enumerate(lines, 1) if "0.5" in line)
    assert code == 1 and [(r["name"], r["line"], r["column"]) for r in map(json.loads, out.splitlines())] == [
        ("bad", requests, lines[requests - 1].index(GPU) + 1), ("inner", half, lines[half - 1].index(GPU) + 1)]


@pytest.mark.parametrize(("text", "kinds", "says"), [
    ("apiVersion: v1\nitems:\n- {kind: Pod, metadata: {name: a}}\n- {kind: Pod, metadata: {name: [b}\nkind: List\n",
     ["item", "problem"], "not valid YAML: "),
    ("apiVersion: v1\nitems:\n- {kind: Pod, metadata: {name: a}}\n- {kind: Pod, x: *nowhere}\nkind: List\n",
     ["item", "problem"], "not valid YAML: found undefined alias"),
    ("apiVersion: v1\nitems:\n- &a {kind: Pod, metadata: {name: a}}\n- {kind: Pod, metadata: {name: b}, x: *a}\n"
     "kind: List\n", ["item", "item", "list"], ""),
    ("apiVersion: v1\nitems:\n- {kind: Pod, metadata: {creationTimestamp: 2024-13-45}}\n- {kind: Pod}\nkind: List\n",
     ["broken-item", "item", "list"], "month must be in 1..12"),
], ids=["syntax error", "undefined alias", "an alias to an earlier item", "a value refused"])
def test_a_broken_yaml_list_keeps_the_items_before_the_break(text, kinds, says):
    parts = list(yaml_parts(io.BytesIO(text.encode())))
    assert [p.kind for p in parts] == kinds
    assert says in str(parts[-1].value if parts[-1].kind == "problem" else parts[0].value)


def test_a_list_and_the_documents_after_it(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text("apiVersion: v1\nitems:\n- {metadata: {name: x}}\nkind: List\n---\n"
                    "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n")
    code, _, err = cli("check", str(path))
    assert code == 2 and err == [f"{path}: document 1: item 1 is not a Kubernetes object (no kind)",
                                 "1 object checked, 0 denied, 0 warned"]


def test_load_reads_a_yaml_list_whole():
    text = kubectl_yaml_list(pods(3))
    [document] = yamlstream.load(text)
    assert document.value == yaml.safe_load(text)
