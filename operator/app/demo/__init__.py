"""`specpilot demo`: the emulator in real time behind the local actuator, with a live view."""
