"""The second engine: vLLM as its users run it, in an environment of its own (vLLM pins its own transformers).

`env` makes that environment (`make install-vllm`) and finds its interpreter; `server` starts and always stops a
`vllm serve` process; `bench` runs `vllm bench serve` against it and reads its result file; `args` turns a cell's
config into the server's and the load generator's arguments; `summary` turns bench results into a record's summary.
Nothing here imports torch or the HF engine: the experiment layer (`experiment.vllm_cell`) glues it to a cell.
"""
