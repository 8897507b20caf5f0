"""Tables and plots of the report stage."""
