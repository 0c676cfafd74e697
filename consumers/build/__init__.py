"""The build consumer: ``ContextRequest`` + ``ContextPolicy`` in, ``ContextBrief`` or an error out,
on the reply topic the request names.

    settings.py  CONTEXTCORE_BUILD_* (its own group, port, in-flight bound, source timeout)
    handler.py   one record to one outcome: decode, admit, build, reply
    sources.py   the context sources this process serves
    app.py       the application (``contextcore serve build``)
"""
