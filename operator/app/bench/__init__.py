"""`specpilot bench`: the yardstick (policies x hidden worlds x traffic, scored as users feel
it)."""
