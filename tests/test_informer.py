"""The generic list+watch loop against a fake apiserver: resume, bookmarks, relist on 410, backoff, 404."""

from __future__ import annotations

import threading

import pytest

from webhook.core.cluster import CLUSTER_KINDS, ClusterState
from webhook.kube.informer import Gone, Informer, NotServed

NODES, RESOURCE_SLICES = CLUSTER_KINDS[0], CLUSTER_KINDS[1]


def node(name, rv, gpus=4):
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": rv},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


class FakeSource:
    """Scripted answers: each list() and watch() call takes the next one; an exception is raised."""

    def __init__(self, lists, watches):
        self.lists, self.watches = list(lists), list(watches)
        self.calls: list[tuple] = []

    def list(self, path):
        self.calls.append(("list", path))
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, path, resource_version, timeout):
        self.calls.append(("watch", path, resource_version))
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        yield from answer


def informer(source, kind="nodes"):
    state = ClusterState("accelerator")
    return Informer(NODES if kind == "nodes" else RESOURCE_SLICES, source, state.indices[kind]), state


def test_list_then_watch_from_the_lists_version_then_resume_from_the_last_one_seen():
    source = FakeSource(
        [([node("a", "10")], "10")],
        [[{"type": "ADDED", "object": node("b", "11")}, {"type": "BOOKMARK", "object": {"metadata": {
            "resourceVersion": "15"}}}],
         [{"type": "DELETED", "object": node("a", "16")}]],
    )
    inf, state = informer(source)
    inf.step()
    assert set(state.indices["nodes"].items()) == {"a", "b"} and inf.resource_version == "15"
    inf.step()  # the server closed the watch: resume, no relist
    assert source.calls == [("list", "/api/v1/nodes"), ("watch", "/api/v1/nodes", "10"),
                            ("watch", "/api/v1/nodes", "15")]
    assert set(state.indices["nodes"].items()) == {"b"} and inf.resource_version == "16"
    assert inf.loaded and not inf.stale


def test_410_gone_means_list_again():
    source = FakeSource([([node("a", "1")], "1"), ([node("c", "90")], "90")],
                        [[{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}], []])
    inf, state = informer(source)
    with pytest.raises(Gone):
        inf.step()
    inf.resource_version = None  # what run() does on Gone
    inf.step()
    assert [c[0] for c in source.calls] == ["list", "watch", "list", "watch"]
    assert set(state.indices["nodes"].items()) == {"c"}


def test_errors_back_off_keep_the_objects_and_show_as_stale():
    stop = threading.Event()
    waits = []

    class Source(FakeSource):
        def watch(self, path, resource_version, timeout):
            if len(waits) >= 4:
                stop.set()
            raise ConnectionError("apiserver away")

    inf, state = informer(Source([([node("a", "1")], "1")], []))
    inf._stop = stop
    real_wait = stop.wait
    stop.wait = lambda seconds: (waits.append(seconds), real_wait(0))[1]  # type: ignore[method-assign]
    inf.run()
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert inf.stale and "apiserver away" in inf.last_error
    assert set(state.indices["nodes"].items()) == {"a"}, "a lost watch never clears what was loaded"


def test_a_resource_the_apiserver_does_not_serve_is_loaded_empty():
    inf, state = informer(FakeSource([NotServed("/apis/resource.k8s.io/v1/resourceslices")], []), "resourceslices")
    with pytest.raises(NotServed):
        inf.step()
    assert inf.loaded and not inf.served and len(state.indices["resourceslices"]) == 0
    assert "resourceslices" not in state.waiting_for()


def test_an_error_event_that_is_not_410_is_an_error():
    inf, _ = informer(FakeSource([([], "1")], [[{"type": "ERROR", "object": {"code": 500, "message": "boom"}}]]))
    with pytest.raises(Exception, match="HTTP 500: boom"):
        inf.step()
