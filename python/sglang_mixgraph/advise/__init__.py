"""`sglang-mixgraph advise`: which of this plugin's patches pays on a running SGLang server.

It attaches to a server (starts none), profiles a few of its forward steps with SGLang's own
profiling endpoints, reads the torch profiler trace every rank writes and prices each patch
that could act there against what the trace shows. One module per part:
`server` the HTTP calls and what `/server_info` and `/model_info` say of the deployment;
`capture` starting and stopping the profile, the optional load, waiting for the traces;
`steps` a rank's trace read into forward steps (host and GPU time, launches, kernel classes);
`summary` the steps grouped by kind, with decode rows, contexts, buckets and padding;
`evidence` the figures measured on GPUs that a prediction borrows, each with its record;
`split_pricing` the mixed split's own cost model applied to the profiled MIXED steps;
`verdicts` one verdict per patch; `report` the text and the JSON; `command` the run behind
the command's front (cli/advise.py): the arguments checked, the profile or the recorded traces
judged, every failure one line (docs/advise.md).
"""
