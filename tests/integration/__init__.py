"""Tests of the library as a whole: every helper, family or version, the docs, the packaging, the references."""
