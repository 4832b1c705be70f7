"""The GPU catalog: Compute Engine's facts (GPU types, shapes, zones, disks, quotas, prices) as typed
objects, read from gpu_train/data/gpu-catalog.yaml by one loader. Below both the stack model and
Compute Engine's rules (gpu_train/gcp/), which judge a stack against these facts."""
