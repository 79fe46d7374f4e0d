"""flashgen code generation: spec -> plan -> rendered CUDA source -> NVRTC cubin -> launch."""
