"""The model side: the proxy between runners and a live provider, exchanges turned into trace turns, the
held model that gives every host the reference's answers.
"""
