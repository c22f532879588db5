"""`colbert-k8s doctor` against the emulator: a healthy cluster, then each check failing on its own."""

from __future__ import annotations

import pytest

from tests.helpers.doctor import BLOCK, CPU_NODE, check_rows, deployment, doctor, healthy_cluster


def test_a_healthy_cluster_is_all_ok(tmp_path):
    with healthy_cluster(tmp_path) as emu:
        res = doctor(emu)
        assert res.exit_code == 0, res.output
        lines = res.output.splitlines()
        assert lines[0].split() == ["CHECK", "RESULT", "DETAIL", "HINT"]
        assert all(" OK " in line for line in lines[1:]), res.output
        rows = check_rows(doctor(emu, "-o", "json"))
        assert rows["GPU nodes"] == ("OK", "1 node(s): 8 x NVIDIA-H100-80GB-HBM3")
        assert rows["ReadWriteMany storage"][1].startswith("shared")
        assert rows["namespace"] == ("OK", "ml; quota requests.nvidia.com/gpu 8/16")
        assert "team-a" in rows["Kueue queues"][1]
        assert {"may create trainjobs", "may create pytorchjobs", "may create configmaps"} <= set(rows)


FAILURES = [
    # (what is wrong, emulator overrides, deployments to break, check, level, words)
    ("no job API", dict(with_crd=False, with_v2=False), None, "trainjob API", "FAIL", "neither job API is served"),
    (
        "controller down",
        {},
        ("kubeflow-system", "kubeflow-trainer-controller-manager"),
        "trainjob controller",
        "FAIL",
        "0/1 ready",
    ),  # noqa: E501
    ("no torch runtime", dict(runtimes=()), None, "torch runtime", "FAIL", "does not exist"),
    ("no GPU node", dict(nodes=(CPU_NODE,)), None, "GPU nodes", "WARN", "no node has allocatable"),
    ("no RWX class", dict(storage_classes=(BLOCK,)), None, "ReadWriteMany storage", "WARN", "have: gp3"),
    ("no namespace", dict(namespaces=("default",)), None, "namespace", "FAIL", "does not exist"),
    ("no right to create", dict(denied=("trainjobs",)), None, "may create trainjobs", "FAIL", "RBAC: denied"),
]


@pytest.mark.parametrize("what,overrides,broken,check,level,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_each_failing_check_is_one_line_and_sets_the_exit_code(tmp_path, what, overrides, broken, check, level, words):
    with healthy_cluster(tmp_path, **overrides) as emu:
        if broken:
            emu.add("apps/v1/deployments", broken[0], deployment(*broken, 0))
        res = doctor(emu, "-o", "json")
        assert res.exit_code == {"WARN": 1, "FAIL": 2}[level], res.output
        rows = check_rows(res)
        assert rows[check][0] == level and words in rows[check][1], rows[check]
        others = [name for name, (lvl, _) in rows.items() if lvl != "OK" and name != check]
        assert all(rows[n][0] != "FAIL" for n in others) or what == "no job API", others
        table = doctor(emu)
        assert "Traceback" not in table.output and table.exit_code == res.exit_code


def test_asking_for_an_api_that_is_not_served_fails_that_line(tmp_path):
    with healthy_cluster(tmp_path, with_v2=False) as emu:
        rows = check_rows(doctor(emu, "--api", "trainjob", "-o", "json"))
        assert rows["trainjob API"][0] == "FAIL" and rows["pytorchjob API"][0] == "OK"
