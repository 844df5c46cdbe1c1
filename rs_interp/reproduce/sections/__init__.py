"""The section builders, one module per part of the theory; :data:`rs_interp.reproduce.SECTIONS` lists them."""
