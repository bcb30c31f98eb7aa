"""What the commands share: SGLang's resolution of a deployment, its inputs, and its report.

Below the commands (`cli/`, `advise/`, `ab/`), above the planner and the patches; no command
imports another, so whatever two of them read lives here. One module per part:
`resolve` SGLang's own resolution of server arguments for a described GPU, without a server;
`plan_inputs` what `plan` and `ab` check before resolving; `presets` the embedded reference
deployments; `local_gpu` this machine's GPU as the default target; `errors` a failed
resolution in one line; `memory_inputs` and `dsv4_kv_pool` what the memory line reads of a
resolution; `dsa_surface` a DSA model's breakable prefill graph in lines; `plan_format` the
planner's result as JSON and text; `upstream_guards` the upstream behaviour `doctor` checks,
`doctor_report` the report `doctor` prints; `plan_report` what `plan` runs and prints;
`serving_client` a running server's URL and SGLang's load client (`ab`, `advise`).
"""
