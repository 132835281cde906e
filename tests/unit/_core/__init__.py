"""Tests of the compiled core, each against its pure-Python twin."""
