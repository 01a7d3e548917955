"""Arm's VGF tooling: the SDK's tools, the emulation layers' environment, running a VGF with
``scenario_runner``, the scenario format, its writer and its runner, the VGF delegate."""
