"""The netCDF view (``--netcdf``): each reference set or repository as netCDF classic
files, synthesized from the decoded view.

``header`` (the header's bytes and the layout), ``types`` (each decoded dtype and
attribute as a netCDF type), ``attributes`` (a variable's attributes in the types CF
gives them), ``model`` (a view's groups as files), ``names`` (the groups' file names),
``boxes`` (a byte range's elements as boxes of chunks), ``view`` (the files as the tree
sees them), ``reads`` (a byte range assembled from decoded chunks), ``stretches`` (wide
variables assembled a stretch of rows at a time) and ``options``.  Importing this
package loads nothing heavy: the options parser imports ``options``.
"""
