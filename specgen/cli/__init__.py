"""The command line: `app.py` composes the commands (one module each) and maps errors to one
line; `options.py` holds the options they share."""
