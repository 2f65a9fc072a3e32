"""Sandbox tools for agent frameworks: a model gets a shell, a Python kernel and the files of one sandbox.

    from mentis import Sandbox
    from mentis.integrations.langchain import sandbox_tools   # pip install 'mentis-sandbox[langchain]'
    from mentis.integrations.crewai import sandbox_tools      # pip install 'mentis-sandbox[crewai]'

Both give the same five tools: `run_shell(command, timeout)`, `run_python(code)`, `read_file(path)`,
`write_file(path, content)` and `list_files(path)`. What a tool returns is text for the model: a command's
exit code, stdout and stderr; a cell's printed text, results and error; a file's content. Long text is cut
in the middle to `limit` characters (20,000 unless given), with a note saying so. A command that fails is
an answer with its exit code; a call the runtime refuses (a missing file, a sandbox gone) is the framework's
tool error, whose text the model sees.

Importing this package imports no framework: each module imports its own, and says which extra to install
when it is missing.
"""
