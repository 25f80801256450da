"""The commands that look at data: scan, inspect (describe), preview, verify."""
