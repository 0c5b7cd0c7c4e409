"""Fail-slow detection (#28): step times from the job, stragglers and slow ports against their peers, and job
slowdowns as incidents.
"""
