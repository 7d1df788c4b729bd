"""Bundled workloads, loaded as `examples:NAME` (each module follows the workload-file contract)."""

EXAMPLES = {
    "mlp": "gpuwise.examples.mlp",
    "lenet": "gpuwise.examples.lenet",
    "resnet": "gpuwise.examples.resnet",
    "gpt-mini": "gpuwise.examples.gpt_mini",
    "imagefolder": "gpuwise.examples.imagefolder",
}
