"""Checking a written program: the verdict, verification runs, pictures, bundled programs,
``etkit inspect``."""
