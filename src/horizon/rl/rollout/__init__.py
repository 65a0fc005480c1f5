"""RL rollout (SPEC §4, §4.1): the one `generate` (latent-cache decoding with an in-flight
weight-swap hook) and its adapter to the agent's policy interface (`sampler.make_policy`)."""
