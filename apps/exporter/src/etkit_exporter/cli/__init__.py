"""The command-line tools: etkit (run, inspect, doctor, vulkan-env) and etkit-export."""
