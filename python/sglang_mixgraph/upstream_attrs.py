"""The attributes the plugin puts on upstream objects, each named once.

Patches keep per-step state on SGLang's own objects (a forward batch, a metadata build, the
model runner, a breakable graph) rather than in side tables keyed by id, so the state dies with
its object. Every name here is prefixed so it never collides with an upstream field, and says
which object carries it and what it holds; a patch that reads another patch's attribute (replay
read-done reads the split's plan) imports the same constant instead of repeating the string.
Imports nothing: any module of the package may import it.
"""

# On ForwardBatch (the mixed split, from ForwardBatch.init_new): the batch's decode requests.
FORWARD_BATCH_NUM_DECODE = "_mixgraph_num_decode"
# On ForwardBatch: init_new saw a MIXED batch (before a DP relabel could change its mode).
FORWARD_BATCH_BUILT_MIXED = "_mixgraph_built_mixed"
# On DSV4Metadata, one per metadata build: the split's plan (a planned replay built its caches).
METADATA_SPLIT_PLAN = "mixgraph_split"
# On DeepseekV4AttnBackend (the mixed split): (the KV pool, {compress ratio: layers} of the
# pool's layers), counted once per pool for the plan's cost model and its per-ratio inputs.
BACKEND_SPLIT_LAYERS = "_mixgraph_split_layers"
# On DeepseekV4AttnBackend (the mixed split): (the KV pool, {layer id: (the layer's SWA and
# compressed buffers' address/shape/dtype, their decode-kernel views)}), made once per layer.
BACKEND_SPLIT_KV_VIEWS = "_mixgraph_split_kv_views"
# On DeepseekV4AttnBackend (the mixed split, SGLANG_MIXGRAPH_SPLIT_TAIL_GRAPHS=1): the decode
# tails' CUDA graphs and their static buffers (core.decode_tail_graphs.TailGraphs).
BACKEND_SPLIT_TAIL_GRAPHS = "_mixgraph_split_tail_graphs"
# On SGLang's Envs (registered by `flags`): replay read-done's switch. The mixed split reads it
# through `flags.FLAGS` (whether read-done may be published for a replay before its first
# layer); neither patch imports the other.
ENVS_REPLAY_READ_DONE = "SGLANG_OPT_DSV4_REPLAY_READ_DONE"
# On ModelRunner, between replay read-done's PRE_REPLAY and upstream's publisher: the replay's
# label and the event the mailbox held before.
RUNNER_PENDING_READ_DONE = "_mixgraph_replay_read_done"
# On BreakableCUDAGraph (empty-segment dropping): whether the segment being captured recorded a
# node, one flag per entry of its _segments, and the replay plan when a segment is dropped.
GRAPH_NEXT_SEGMENT_HAS_NODES = "_mixgraph_next_segment_has_nodes"
GRAPH_SEGMENT_HAS_NODES = "_mixgraph_segment_has_nodes"
GRAPH_DROP_PLAN = "_mixgraph_replay_plan"
# On DeepseekV4AttnBackend (compress plan cap): {compress ratio: the most requests per batch its
# breakable-capture plans were capped for}, read by the replay check of every batch.
BACKEND_COMPRESS_PLAN_CAPS = "_mixgraph_compress_plan_caps"
