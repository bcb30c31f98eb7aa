"""The planner: what a deployment's graphs will be, from typed facts, for `plan` and one hook.

`deployment_facts` reads SGLang's resolving server arguments once into a `Deployment` (the only
module here that sees them); `graph_plan` derives the buckets, the capture estimate, the checks
and the report from those facts; `prefill_settlement` is the planner's answer to the
graph-config patch's resolution hook; `split_view` names what the mixed split's
deployment-wide fallbacks read of a deployment (the planner's facts and advise's both hold it).
SGLang's serving processes import the planner only when that hook runs (never at plugin load);
`plan`, `doctor` and `advise` import it to describe a deployment. The planner reads no server arguments of its own and imports no patch: a patch's
effect on the plan reaches it as a fact (test/test_package_layout.py checks both by import).
"""
