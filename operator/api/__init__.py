"""The SpecDeployment API: its names, its typed spec, decoding and defaults."""
