"""dpaudit.audits"""
