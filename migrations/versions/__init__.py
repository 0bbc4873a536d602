"""Alembic revision scripts (a package so they ship inside the installed distribution)."""
