"""deploy/components/dra keeps each node's agent to its own ResourceSlices: the admission policy
renders with `kubectl kustomize` (as tests/deploy renders every component), validates strictly
against the Kubernetes schemas, and checks the token's node against the slice's."""

from __future__ import annotations

from pathlib import Path

from partkeeper.dra import DRIVER
from tests_support.manifests import render, validate, with_components


def test_the_resourceslice_policy_renders_validates_and_is_bound(tmp_path: Path) -> None:
    docs = render(with_components(tmp_path, "dra"))
    # the base's Node policy renders beside it (tests/deploy/test_manifests.py)
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                and d["metadata"]["name"] == "partkeeper-resourceslices"]
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
                and d["spec"]["policyName"] == "partkeeper-resourceslices"]
    validate(policies + bindings)
    (policy,) = policies
    (binding,) = bindings
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (match,) = spec["matchConditions"]
    account = next(d for d in docs if d["kind"] == "ClusterRoleBinding"
                   and d["metadata"]["name"] == "partkeeper-dra")["subjects"][0]
    assert (f'"system:serviceaccount:{account["namespace"]}:{account["name"]}"'
            in match["expression"]), "the policy names the account the role is bound to"
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["tokenNode"]
    assert "oldObject" in variables["slice"], "a DELETE is checked against the old object"
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert "variables.tokenNode == variables.sliceNode" in checks
    assert f"'{DRIVER}'" in checks
