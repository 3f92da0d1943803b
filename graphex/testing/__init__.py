"""Testing helpers for graphex. `graphex.testing.sim` is the simulated accelerator ("gxsim")."""
