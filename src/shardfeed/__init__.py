"""shardfeed"""
