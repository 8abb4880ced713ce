"""Porting from smdebug 1.0.34: its hooks', configurations' and analysis behaviours."""
