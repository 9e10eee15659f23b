"""GPU measurements that are not experiments on a stage: launch-layer and replay benchmarks, the per-launch-site
roofline and the floors, and the calibration of the sim's cost model."""
