"""Where readings come from: NVML on a real node, or a simulation, behind one small Protocol."""
