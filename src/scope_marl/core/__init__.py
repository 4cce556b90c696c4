"""The bottom layer: data types, seeds, atomic files and the run-directory layout.

Everything above imports from here; nothing here imports anything else of the package.
"""
