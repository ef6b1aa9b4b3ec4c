#!/usr/bin/env python3
"""Generator for examples/related/*: every value below is computed from the
Python expression next to it, and the number written in each "answer" string is
asserted to equal that computed value (rounded to 2 decimals). Run:
    python3 examples/related/build.py && python3 examples/related/check.py
"""

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

# Each entry: slug, problem, solution, answer, expr ; then queries: list of
# (kind, question, answer, expr). kind in P (paraphrase), N (near-miss/numbers),
# A (near-miss/asked).
SETS = {
    "physics": [
        (
            "car-distance",
            "A car moving at 4 m/s accelerates uniformly at 2.5 m/s^2 for 8 s. How far does it travel during these 8 seconds?",
            "Distance at the initial speed: 4 m/s x 8 s = 32 m. Extra distance from the acceleration: 0.5 x 2.5 x 8^2 = 0.5 x 2.5 x 64 = 80 m. Total: 32 + 80 = 112 m.",
            "112 m",
            "4*8 + 0.5*2.5*8**2",
            [
                (
                    "P",
                    "Starting at a speed of 4 m/s, a car speeds up with a constant acceleration of 2.5 m/s^2 over 8 seconds. What distance does it cover in that time?",
                    "112 m",
                    "4*8 + 0.5*2.5*8**2",
                ),
                (
                    "N",
                    "A car moving at 6 m/s accelerates uniformly at 2.5 m/s^2 for 8 s. How far does it travel during these 8 seconds?",
                    "128 m",
                    "6*8 + 0.5*2.5*8**2",
                ),
                (
                    "A",
                    "A car moving at 4 m/s accelerates uniformly at 2.5 m/s^2 for 8 s. What is its speed at the end of these 8 seconds?",
                    "24 m/s",
                    "4 + 2.5*8",
                ),
            ],
        ),
        (
            "series-power",
            "A 24 V battery is connected to two resistors in series, 4 ohms and 8 ohms. How much power is dissipated in the 8-ohm resistor?",
            "Total resistance: 4 + 8 = 12 ohms. Current: I = 24 / 12 = 2 A. Power in the 8-ohm resistor: P = I^2 x R = 2^2 x 8 = 32 W.",
            "32 W",
            "(24/(4+8))**2*8",
            [
                (
                    "P",
                    "Two resistors of 4 ohms and 8 ohms are wired in series across a 24-volt battery. What power does the 8-ohm resistor dissipate?",
                    "32 W",
                    "(24/(4+8))**2*8",
                ),
                (
                    "N",
                    "A 36 V battery is connected to two resistors in series, 4 ohms and 8 ohms. How much power is dissipated in the 8-ohm resistor?",
                    "72 W",
                    "(36/(4+8))**2*8",
                ),
                (
                    "A",
                    "A 24 V battery is connected to two resistors in series, 4 ohms and 8 ohms. What is the voltage across the 4-ohm resistor?",
                    "8 V",
                    "24/(4+8)*4",
                ),
            ],
        ),
        (
            "crane-power",
            "A crane lifts a 250 kg crate 12 m straight up at constant speed in 20 s. Using g = 9.8 m/s^2, what is the average power delivered by the crane?",
            "Weight: 250 x 9.8 = 2450 N. Work: W = 2450 x 12 = 29400 J. Power: P = 29400 / 20 = 1470 W.",
            "1470 W",
            "250*9.8*12/20",
            [
                (
                    "P",
                    "Taking g = 9.8 m/s^2, a crane raises a 250-kilogram crate vertically by 12 metres at a steady speed, taking 20 seconds. What average power does the crane supply?",
                    "1470 W",
                    "250*9.8*12/20",
                ),
                (
                    "N",
                    "A crane lifts a 300 kg crate 12 m straight up at constant speed in 15 s. Using g = 9.8 m/s^2, what is the average power delivered by the crane?",
                    "2352 W",
                    "300*9.8*12/15",
                ),
                (
                    "A",
                    "A crane lifts a 250 kg crate 12 m straight up at constant speed in 20 s. Using g = 9.8 m/s^2, how much work (in joules) does the crane do on the crate?",
                    "29400 J",
                    "250*9.8*12",
                ),
            ],
        ),
        (
            "heater-time",
            "A 1500 W heater warms 2 kg of water from 20 C to 80 C. The specific heat of water is 4186 J/(kg C) and no heat is lost. How many seconds does it take? Round to 2 decimal places.",
            "Temperature rise: 80 - 20 = 60 C. Heat needed: Q = 2 x 4186 x 60 = 502320 J. Time: t = 502320 / 1500 = 334.88 s.",
            "334.88 s",
            "2*4186*(80-20)/1500",
            [
                (
                    "P",
                    "Assuming no heat losses, how long in seconds does a 1500-watt heater need to raise 2 kg of water from 20 C to 80 C? Use 4186 J/(kg C) for the specific heat of water and round to 2 decimal places.",
                    "334.88 s",
                    "2*4186*(80-20)/1500",
                ),
                (
                    "N",
                    "A 1500 W heater warms 3 kg of water from 20 C to 80 C. The specific heat of water is 4186 J/(kg C) and no heat is lost. How many seconds does it take? Round to 2 decimal places.",
                    "502.32 s",
                    "3*4186*(80-20)/1500",
                ),
                (
                    "A",
                    "A 1500 W heater warms 2 kg of water from 20 C to 80 C. The specific heat of water is 4186 J/(kg C) and no heat is lost. How much heat energy, in joules, does the water absorb?",
                    "502320 J",
                    "2*4186*(80-20)",
                ),
            ],
        ),
    ],
    "chemistry": [
        (
            "nacl-molarity",
            "11.7 g of sodium chloride (molar mass 58.5 g/mol) is dissolved in water to make 500 mL of solution. What is the molar concentration of the solution?",
            "Moles of NaCl: 11.7 / 58.5 = 0.2 mol. Volume: 500 mL = 0.5 L. Concentration: 0.2 / 0.5 = 0.4 mol/L.",
            "0.4 mol/L",
            "11.7/58.5/0.5",
            [
                (
                    "P",
                    "A chemist dissolves 11.7 grams of NaCl (58.5 g/mol) and adds water until the solution volume is 500 mL. What is the molarity?",
                    "0.4 mol/L",
                    "11.7/58.5/0.5",
                ),
                (
                    "N",
                    "17.55 g of sodium chloride (molar mass 58.5 g/mol) is dissolved in water to make 250 mL of solution. What is the molar concentration of the solution?",
                    "1.2 mol/L",
                    "17.55/58.5/0.25",
                ),
                (
                    "A",
                    "11.7 g of sodium chloride (molar mass 58.5 g/mol) is dissolved in water. What total volume of solution, in mL, is needed for a concentration of 0.25 mol/L?",
                    "800 mL",
                    "11.7/58.5/0.25*1000",
                ),
            ],
        ),
        (
            "hcl-dilution",
            "50 mL of 6.0 mol/L hydrochloric acid is diluted with water to a total volume of 400 mL. What is the new concentration?",
            "Moles of HCl: 6.0 x 0.050 = 0.30 mol. New volume: 0.400 L. New concentration: 0.30 / 0.400 = 0.75 mol/L.",
            "0.75 mol/L",
            "6.0*0.050/0.400",
            [
                (
                    "P",
                    "Water is added to 50 mL of 6.0 M HCl until the volume reaches 400 mL. What is the concentration of the diluted acid?",
                    "0.75 mol/L",
                    "6.0*0.050/0.400",
                ),
                (
                    "N",
                    "50 mL of 6.0 mol/L hydrochloric acid is diluted with water to a total volume of 600 mL. What is the new concentration?",
                    "0.5 mol/L",
                    "6.0*0.050/0.600",
                ),
                (
                    "A",
                    "50 mL of 6.0 mol/L hydrochloric acid is diluted with water to a concentration of 0.75 mol/L. How many mL of water were added?",
                    "350 mL",
                    "6.0*50/0.75 - 50",
                ),
            ],
        ),
        (
            "water-from-hydrogen",
            "Hydrogen burns in excess oxygen: 2 H2 + O2 -> 2 H2O. What mass of water is produced from 8 g of hydrogen? Use H2 = 2 g/mol and H2O = 18 g/mol.",
            "Moles of H2: 8 / 2 = 4 mol. From the equation, 2 mol H2 give 2 mol H2O, so 4 mol H2O form. Mass: 4 x 18 = 72 g.",
            "72 g",
            "8/2*18",
            [
                (
                    "P",
                    "According to 2 H2 + O2 -> 2 H2O, how many grams of water form when 8 grams of H2 react completely with plenty of oxygen? Molar masses: H2 2 g/mol, H2O 18 g/mol.",
                    "72 g",
                    "8/2*18",
                ),
                (
                    "N",
                    "Hydrogen burns in excess oxygen: 2 H2 + O2 -> 2 H2O. What mass of water is produced from 5 g of hydrogen? Use H2 = 2 g/mol and H2O = 18 g/mol.",
                    "45 g",
                    "5/2*18",
                ),
                (
                    "A",
                    "Hydrogen burns in oxygen: 2 H2 + O2 -> 2 H2O. What mass of oxygen is consumed when 8 g of hydrogen burns completely? Use H2 = 2 g/mol and O2 = 32 g/mol.",
                    "64 g",
                    "8/2/2*32",
                ),
            ],
        ),
        (
            "ideal-gas-pressure",
            "2.0 mol of an ideal gas is held at 300 K in a 0.050 m^3 container. Using R = 8.314 J/(mol K), what is the pressure in pascals?",
            "nRT = 2.0 x 8.314 x 300 = 4988.4 J. P = nRT / V = 4988.4 / 0.050 = 99768 Pa.",
            "99768 Pa",
            "2.0*8.314*300/0.050",
            [
                (
                    "P",
                    "A sealed 0.050 m^3 vessel contains 2.0 moles of ideal gas at a temperature of 300 K. With R = 8.314 J/(mol K), find the gas pressure in Pa.",
                    "99768 Pa",
                    "2.0*8.314*300/0.050",
                ),
                (
                    "N",
                    "3.0 mol of an ideal gas is held at 400 K in a 0.050 m^3 container. Using R = 8.314 J/(mol K), what is the pressure in pascals?",
                    "199536 Pa",
                    "3.0*8.314*400/0.050",
                ),
                (
                    "A",
                    "2.0 mol of an ideal gas is held in a 0.050 m^3 container. Using R = 8.314 J/(mol K), at what temperature in kelvin is the pressure 150000 Pa? Round to 2 decimal places.",
                    "451.05 K",
                    "150000*0.050/(2.0*8.314)",
                ),
            ],
        ),
    ],
    "finance": [
        (
            "compound-interest",
            "$2000 is deposited at 5% annual interest, compounded once a year, for 3 years. What is the balance at the end? Give the answer to the nearest cent.",
            "Growth factor per year: 1.05. After 3 years: 1.05^3 = 1.157625. Balance: 2000 x 1.157625 = $2315.25.",
            "$2315.25",
            "2000*1.05**3",
            [
                (
                    "P",
                    "Someone puts $2000 in a savings account paying 5% per year, compounded annually, and leaves it for 3 years. How much is in the account then, to the nearest cent?",
                    "$2315.25",
                    "2000*1.05**3",
                ),
                (
                    "N",
                    "$2000 is deposited at 5% annual interest, compounded once a year, for 4 years. What is the balance at the end? Give the answer to the nearest cent.",
                    "$2431.01",
                    "2000*1.05**4",
                ),
                (
                    "A",
                    "$2000 is deposited at 5% annual interest, compounded once a year, for 3 years. How much interest is earned in total? Give the answer to the nearest cent.",
                    "$315.25",
                    "2000*1.05**3 - 2000",
                ),
            ],
        ),
        (
            "discount-tax",
            "A jacket is priced at $80. It is on sale for 25% off, and then 8% sales tax is added to the sale price. What is the final price, to the nearest cent?",
            "Discount: 25% of 80 = $20, so the sale price is 80 - 20 = $60. Tax: 8% of 60 = $4.80. Final price: 60 + 4.80 = $64.80.",
            "$64.80",
            "80*(1-0.25)*1.08",
            [
                (
                    "P",
                    "An $80 jacket gets a 25% discount, and 8% sales tax is charged on the discounted price. How much does the customer pay in total, to the nearest cent?",
                    "$64.80",
                    "80*(1-0.25)*1.08",
                ),
                (
                    "N",
                    "A jacket is priced at $80. It is on sale for 40% off, and then 8% sales tax is added to the sale price. What is the final price, to the nearest cent?",
                    "$51.84",
                    "80*(1-0.40)*1.08",
                ),
                (
                    "A",
                    "A jacket is priced at $80. It is on sale for 25% off, and 8% sales tax is added to whatever price is paid. How much does a buyer save, compared with buying it at full price plus tax? Give the answer to the nearest cent.",
                    "$21.60",
                    "80*1.08 - 80*0.75*1.08",
                ),
            ],
        ),
        (
            "cereal-unit-price",
            "A 750 g box of cereal costs $4.50 and a 1.2 kg box costs $6.60. Compare the price per kilogram: how much cheaper per kilogram is the cheaper box? Give the answer to the nearest cent.",
            "Small box: 4.50 / 0.75 = $6.00 per kg. Large box: 6.60 / 1.2 = $5.50 per kg. Difference: 6.00 - 5.50 = $0.50 per kg, the large box is cheaper.",
            "$0.50 per kg",
            "4.50/0.75 - 6.60/1.2",
            [
                (
                    "P",
                    "Cereal comes in a 750-gram box for $4.50 or a 1.2-kilogram box for $6.60. By how many dollars per kilogram is the better-value box cheaper? Round to the nearest cent.",
                    "$0.50 per kg",
                    "4.50/0.75 - 6.60/1.2",
                ),
                (
                    "N",
                    "A 750 g box of cereal costs $4.50 and a 1.2 kg box costs $6.24. Compare the price per kilogram: how much cheaper per kilogram is the cheaper box? Give the answer to the nearest cent.",
                    "$0.80 per kg",
                    "4.50/0.75 - 6.24/1.2",
                ),
                (
                    "A",
                    "A 750 g box of cereal costs $4.50 and a 1.2 kg box costs $6.60. You need 6 kg of cereal. How much do you save by buying 5 large boxes instead of 8 small boxes? Give the answer to the nearest cent.",
                    "$3.00",
                    "8*4.50 - 5*6.60",
                ),
            ],
        ),
        (
            "loan-monthly",
            "Sam borrows $1500 at 6% simple interest per year and repays the loan plus interest in 18 equal monthly payments. How much is each payment, to the nearest cent?",
            "Time: 18 months = 1.5 years. Interest: 1500 x 0.06 x 1.5 = $135. Total owed: 1500 + 135 = $1635. Monthly payment: 1635 / 18 = $90.83 (90.8333...).",
            "$90.83",
            "(1500 + 1500*0.06*1.5)/18",
            [
                (
                    "P",
                    "A $1500 loan charges simple interest of 6% a year. The borrower pays back principal and interest in 18 equal monthly instalments. What is one instalment, rounded to the nearest cent?",
                    "$90.83",
                    "(1500 + 1500*0.06*1.5)/18",
                ),
                (
                    "N",
                    "Sam borrows $1500 at 6% simple interest per year and repays the loan plus interest in 24 equal monthly payments. How much is each payment, to the nearest cent?",
                    "$70.00",
                    "(1500 + 1500*0.06*2)/24",
                ),
                (
                    "A",
                    "Sam borrows $1500 at 6% simple interest per year and repays the loan plus interest in 18 equal monthly payments. How much interest does he pay in total, to the nearest cent?",
                    "$135.00",
                    "1500*0.06*1.5",
                ),
            ],
        ),
    ],
    "geometry": [
        (
            "garden-path",
            "A rectangular garden measures 12 m by 8 m. A path 1 m wide runs all around the outside of the garden. What is the area of the path?",
            "Outer rectangle: (12 + 2) x (8 + 2) = 14 x 10 = 140 m^2. Garden: 12 x 8 = 96 m^2. Path: 140 - 96 = 44 m^2.",
            "44 m^2",
            "(12+2)*(8+2) - 12*8",
            [
                (
                    "P",
                    "A 1-metre-wide path surrounds a 12 m x 8 m rectangular garden on the outside. How many square metres does the path cover?",
                    "44 m^2",
                    "(12+2)*(8+2) - 12*8",
                ),
                (
                    "N",
                    "A rectangular garden measures 12 m by 8 m. A path 2 m wide runs all around the outside of the garden. What is the area of the path?",
                    "96 m^2",
                    "(12+4)*(8+4) - 12*8",
                ),
                (
                    "A",
                    "A rectangular garden measures 12 m by 8 m. A path 1 m wide runs all around the outside of the garden. What is the perimeter of the outer edge of the path?",
                    "48 m",
                    "2*((12+2)+(8+2))",
                ),
            ],
        ),
        (
            "cylinder-volume",
            "A cylindrical water tank has a radius of 3 m and a height of 5 m. Using pi = 3.14, what is its volume?",
            "Base area: 3.14 x 3^2 = 3.14 x 9 = 28.26 m^2. Volume: 28.26 x 5 = 141.3 m^3.",
            "141.3 m^3",
            "3.14*3**2*5",
            [
                (
                    "P",
                    "Taking pi as 3.14, how many cubic metres does a cylinder-shaped tank hold if it is 5 m tall with a 3 m radius?",
                    "141.3 m^3",
                    "3.14*3**2*5",
                ),
                (
                    "N",
                    "A cylindrical water tank has a radius of 4 m and a height of 5 m. Using pi = 3.14, what is its volume?",
                    "251.2 m^3",
                    "3.14*4**2*5",
                ),
                (
                    "A",
                    "A cylindrical water tank has a radius of 3 m and a height of 5 m. Using pi = 3.14, what is the area of its curved side (lateral surface, without top and bottom)?",
                    "94.2 m^2",
                    "2*3.14*3*5",
                ),
            ],
        ),
        (
            "ladder-height",
            "A 13 m ladder leans against a vertical wall. Its foot is 5 m from the base of the wall on level ground. How high up the wall does the ladder reach?",
            "By Pythagoras: height^2 = 13^2 - 5^2 = 169 - 25 = 144. Height = sqrt(144) = 12 m.",
            "12 m",
            "(13**2 - 5**2)**0.5",
            [
                (
                    "P",
                    "The bottom of a 13-metre ladder stands on flat ground 5 metres away from a vertical wall, and its top rests on the wall. At what height does the top touch the wall?",
                    "12 m",
                    "(13**2 - 5**2)**0.5",
                ),
                (
                    "N",
                    "A 17 m ladder leans against a vertical wall. Its foot is 8 m from the base of the wall on level ground. How high up the wall does the ladder reach?",
                    "15 m",
                    "(17**2 - 8**2)**0.5",
                ),
                (
                    "A",
                    "A 13 m ladder leans against a vertical wall. Its foot is 5 m from the base of the wall on level ground. What is the area of the triangle formed by the ladder, the wall and the ground?",
                    "30 m^2",
                    "0.5*5*(13**2 - 5**2)**0.5",
                ),
            ],
        ),
        (
            "square-minus-circle",
            "A circle is inscribed in a square of side 10 cm (it touches all four sides). Using pi = 3.14, what is the area inside the square but outside the circle?",
            "Square area: 10 x 10 = 100 cm^2. The circle's radius is 10 / 2 = 5 cm, so its area is 3.14 x 5^2 = 78.5 cm^2. Difference: 100 - 78.5 = 21.5 cm^2.",
            "21.5 cm^2",
            "10**2 - 3.14*(10/2)**2",
            [
                (
                    "P",
                    "A 10 cm x 10 cm square has the largest possible circle drawn inside it. With pi = 3.14, find the area of the parts of the square not covered by the circle.",
                    "21.5 cm^2",
                    "10**2 - 3.14*(10/2)**2",
                ),
                (
                    "N",
                    "A circle is inscribed in a square of side 14 cm (it touches all four sides). Using pi = 3.14, what is the area inside the square but outside the circle?",
                    "42.14 cm^2",
                    "14**2 - 3.14*(14/2)**2",
                ),
                (
                    "A",
                    "A circle is inscribed in a square of side 10 cm (it touches all four sides). Using pi = 3.14, what is the circumference of the circle?",
                    "31.4 cm",
                    "2*3.14*(10/2)",
                ),
            ],
        ),
    ],
    "french": [
        (
            "train-distance",
            "Un train roule à 120 km/h pendant 2 h 30 min, puis à 80 km/h pendant 45 min. Quelle distance totale parcourt-il ?",
            "Première partie : 120 x 2,5 = 300 km. Deuxième partie : 45 min = 0,75 h, donc 80 x 0,75 = 60 km. Total : 300 + 60 = 360 km.",
            "360 km",
            "120*2.5 + 80*0.75",
            [
                (
                    "P",
                    "Pendant 2 h 30 min, un train avance à 120 km/h ; il ralentit ensuite à 80 km/h et roule encore 45 minutes. Combien de kilomètres a-t-il parcourus en tout ?",
                    "360 km",
                    "120*2.5 + 80*0.75",
                ),
                (
                    "N",
                    "Un train roule à 120 km/h pendant 2 h 30 min, puis à 90 km/h pendant 1 h. Quelle distance totale parcourt-il ?",
                    "390 km",
                    "120*2.5 + 90*1",
                ),
                (
                    "A",
                    "Un train roule à 120 km/h pendant 2 h 30 min, puis à 80 km/h pendant 45 min. Quelle est sa vitesse moyenne sur l'ensemble du trajet, en km/h, arrondie à 2 décimales ?",
                    "110.77 km/h",
                    "(120*2.5 + 80*0.75)/(2.5+0.75)",
                ),
            ],
        ),
        (
            "recette-farine",
            "Une recette de gâteau pour 6 personnes demande 450 g de farine et 3 œufs. Quelle quantité de farine faut-il pour 10 personnes ?",
            "Farine par personne : 450 / 6 = 75 g. Pour 10 personnes : 75 x 10 = 750 g.",
            "750 g",
            "450/6*10",
            [
                (
                    "P",
                    "Pour 6 personnes, il faut 450 g de farine et 3 œufs dans cette recette de gâteau. Combien de grammes de farine prévoir si l'on reçoit 10 personnes ?",
                    "750 g",
                    "450/6*10",
                ),
                (
                    "N",
                    "Une recette de gâteau pour 6 personnes demande 450 g de farine et 3 œufs. Quelle quantité de farine faut-il pour 8 personnes ?",
                    "600 g",
                    "450/6*8",
                ),
                (
                    "A",
                    "Une recette de gâteau pour 6 personnes demande 450 g de farine et 3 œufs. Combien d'œufs faut-il pour 10 personnes ?",
                    "5 œufs",
                    "3/6*10",
                ),
            ],
        ),
        (
            "peinture-mur",
            "On peint un mur de 5 m de long sur 2,8 m de haut, qui contient une fenêtre de 1,2 m sur 1 m (non peinte). On passe 2 couches, et un litre de peinture couvre 4 m². Combien de litres faut-il ?",
            "Surface du mur : 5 x 2,8 = 14 m². Sans la fenêtre : 14 - 1,2 x 1 = 12,8 m². Pour 2 couches : 12,8 x 2 = 25,6 m². Peinture : 25,6 / 4 = 6,4 L.",
            "6.4 L",
            "(5*2.8 - 1.2*1)*2/4",
            [
                (
                    "P",
                    "Un mur mesure 5 m sur 2,8 m et comporte une fenêtre de 1,2 m x 1 m qu'on ne peint pas. Il faut deux couches et chaque litre de peinture couvre 4 m². Quelle quantité de peinture, en litres, est nécessaire ?",
                    "6.4 L",
                    "(5*2.8 - 1.2*1)*2/4",
                ),
                (
                    "N",
                    "On peint un mur de 6 m de long sur 2,8 m de haut, qui contient une fenêtre de 1,2 m sur 1 m (non peinte). On passe 2 couches, et un litre de peinture couvre 4 m². Combien de litres faut-il ?",
                    "7.8 L",
                    "(6*2.8 - 1.2*1)*2/4",
                ),
                (
                    "A",
                    "On peint un mur de 5 m de long sur 2,8 m de haut, qui contient une fenêtre de 1,2 m sur 1 m (non peinte). On passe 2 couches, et un litre de peinture couvre 4 m². La peinture est vendue en pots de 2,5 L à 18 € le pot. Combien coûtent les pots nécessaires ?",
                    "54 €",
                    "-(-((5*2.8 - 1.2*1)*2/4)//2.5)*18",
                ),
            ],
        ),
        (
            "radiateur-facture",
            "Un radiateur de 1500 W fonctionne 6 heures par jour pendant 30 jours. Le kWh coûte 0,25 €. Combien coûte sa consommation ? Arrondir au centime.",
            "Puissance : 1500 W = 1,5 kW. Énergie : 1,5 x 6 x 30 = 270 kWh. Coût : 270 x 0,25 = 67,50 €.",
            "67.50 €",
            "1.5*6*30*0.25",
            [
                (
                    "P",
                    "Pendant 30 jours, on laisse allumé un radiateur de 1500 watts 6 heures chaque jour. À 0,25 € le kilowattheure, quel est le coût de l'électricité consommée, au centime près ?",
                    "67.50 €",
                    "1.5*6*30*0.25",
                ),
                (
                    "N",
                    "Un radiateur de 1500 W fonctionne 4 heures par jour pendant 30 jours. Le kWh coûte 0,25 €. Combien coûte sa consommation ? Arrondir au centime.",
                    "45.00 €",
                    "1.5*4*30*0.25",
                ),
                (
                    "A",
                    "Un radiateur de 1500 W fonctionne 6 heures par jour pendant 30 jours. Le kWh coûte 0,25 €. Quelle énergie consomme-t-il en tout, en kWh ?",
                    "270 kWh",
                    "1.5*6*30",
                ),
            ],
        ),
    ],
    "spanish": [
        (
            "compra-cambio",
            "Un kilo de manzanas cuesta 2,40 €. María compra 2,5 kg de manzanas y 3 barras de pan a 1,15 € cada una, y paga con un billete de 20 €. ¿Cuánto le devuelven? Redondea al céntimo.",
            "Manzanas: 2,5 x 2,40 = 6,00 €. Pan: 3 x 1,15 = 3,45 €. Total: 6,00 + 3,45 = 9,45 €. Cambio: 20 - 9,45 = 10,55 €.",
            "10.55 €",
            "20 - (2.5*2.40 + 3*1.15)",
            [
                (
                    "P",
                    "María paga con 20 € una compra de 2,5 kg de manzanas, a 2,40 € el kilo, y tres barras de pan de 1,15 € cada una. ¿Qué cambio recibe, al céntimo?",
                    "10.55 €",
                    "20 - (2.5*2.40 + 3*1.15)",
                ),
                (
                    "N",
                    "Un kilo de manzanas cuesta 2,40 €. María compra 2,5 kg de manzanas y 4 barras de pan a 1,15 € cada una, y paga con un billete de 20 €. ¿Cuánto le devuelven? Redondea al céntimo.",
                    "9.40 €",
                    "20 - (2.5*2.40 + 4*1.15)",
                ),
                (
                    "A",
                    "Un kilo de manzanas cuesta 2,40 €. María compra 2,5 kg de manzanas y 3 barras de pan a 1,15 € cada una, y paga con un billete de 20 €. ¿Cuánto gasta en total? Redondea al céntimo.",
                    "9.45 €",
                    "2.5*2.40 + 3*1.15",
                ),
            ],
        ),
        (
            "ciclista-tiempo",
            "Un ciclista recorre 36 km en 1 h 30 min. Si mantiene la misma velocidad, ¿cuántos minutos tardará en recorrer 60 km?",
            "Velocidad: 36 / 1,5 = 24 km/h. Tiempo: 60 / 24 = 2,5 h. En minutos: 2,5 x 60 = 150 min.",
            "150 min",
            "60/(36/1.5)*60",
            [
                (
                    "P",
                    "A ritmo constante, una ciclista hace 36 km en hora y media. ¿Cuántos minutos necesitará para hacer 60 km a esa misma velocidad?",
                    "150 min",
                    "60/(36/1.5)*60",
                ),
                (
                    "N",
                    "Un ciclista recorre 36 km en 1 h 30 min. Si mantiene la misma velocidad, ¿cuántos minutos tardará en recorrer 48 km?",
                    "120 min",
                    "48/(36/1.5)*60",
                ),
                (
                    "A",
                    "Un ciclista recorre 36 km en 1 h 30 min. ¿Cuál es su velocidad en metros por segundo? Redondea a 2 decimales.",
                    "6.67 m/s",
                    "36000/(1.5*3600)",
                ),
            ],
        ),
        (
            "piscina-llenado",
            "Una piscina rectangular mide 10 m de largo, 4 m de ancho y 1,5 m de profundidad. Se llena con un grifo que echa 500 litros por minuto. ¿Cuántas horas tarda en llenarse?",
            "Volumen: 10 x 4 x 1,5 = 60 m³ = 60 000 L. Tiempo: 60 000 / 500 = 120 min. En horas: 120 / 60 = 2 h.",
            "2 h",
            "10*4*1.5*1000/500/60",
            [
                (
                    "P",
                    "Un grifo de 500 L/min llena una piscina de 10 m por 4 m con 1,5 m de profundidad. ¿En cuántas horas queda llena?",
                    "2 h",
                    "10*4*1.5*1000/500/60",
                ),
                (
                    "N",
                    "Una piscina rectangular mide 10 m de largo, 4 m de ancho y 1,5 m de profundidad. Se llena con un grifo que echa 800 litros por minuto. ¿Cuántas horas tarda en llenarse? Redondea a 2 decimales.",
                    "1.25 h",
                    "10*4*1.5*1000/800/60",
                ),
                (
                    "A",
                    "Una piscina rectangular mide 10 m de largo, 4 m de ancho y 1,5 m de profundidad. ¿Cuántos litros de agua caben en ella?",
                    "60000 L",
                    "10*4*1.5*1000",
                ),
            ],
        ),
        (
            "nota-media",
            "Un estudiante ha sacado 6, 7 y 8 en tres exámenes. ¿Qué nota necesita en el cuarto examen para que la media de los cuatro sea 7,5?",
            "Suma necesaria: 7,5 x 4 = 30. Suma actual: 6 + 7 + 8 = 21. Nota necesaria: 30 - 21 = 9.",
            "9",
            "7.5*4 - (6+7+8)",
            [
                (
                    "P",
                    "Tras tres exámenes con notas de 6, 7 y 8, una alumna quiere terminar con una media de 7,5 en los cuatro exámenes. ¿Qué nota debe sacar en el último?",
                    "9",
                    "7.5*4 - (6+7+8)",
                ),
                (
                    "N",
                    "Un estudiante ha sacado 6, 7 y 9 en tres exámenes. ¿Qué nota necesita en el cuarto examen para que la media de los cuatro sea 7,5?",
                    "8",
                    "7.5*4 - (6+7+9)",
                ),
                (
                    "A",
                    "Un estudiante ha sacado 6, 7 y 8 en tres exámenes y luego un 5 en el cuarto. ¿Cuál es la media de los cuatro exámenes? Redondea a 2 decimales.",
                    "6.5",
                    "(6+7+8+5)/4",
                ),
            ],
        ),
    ],
}

KIND = {"P": "paraphrase", "N": "near-miss/numbers", "A": "near-miss/asked"}
IDK = {"P": "paraphrase", "N": "near-miss-numbers", "A": "near-miss-asked"}


#: Sets whose solutions write a decimal comma: their entries' answers are written the same way (a build checks
#: that an entry's answer appears in its solution).
DECIMAL_COMMA = ("french", "spanish")


def val(expr, answer):
    v = round(eval(expr), 2)
    if v == int(v):
        v = int(v)
    m = re.search(r"-?\d+(?:\.\d+)?", answer.replace(",", ""))
    assert m and float(m.group()) == v, (expr, answer, v)
    return v


def main():
    for s, entries in SETS.items():
        lib, qs, n = [], [], {"P": 0, "N": 0, "A": 0}
        for slug, prob, sol, ans, expr, queries in entries:
            eid = f"{s}/{slug}"
            ev = val(expr, ans)
            shown = ans.replace(".", ",") if s in DECIMAL_COMMA else ans  # as the solution writes it
            lib.append({"id": eid, "problem": prob, "solution": sol, "answer": shown})  # a library source's fields
            for k, q, a, e in queries:
                n[k] += 1
                qv = val(e, a)
                if k == "P":
                    assert qv == ev, (eid, q)
                else:
                    assert qv != ev, (eid, q)
                qs.append(
                    {
                        "id": f"{s}-{IDK[k]}-{n[k]}",
                        "question": q,
                        "kind": KIND[k],
                        "expect_entry": eid if k == "P" else None,
                        "near_entry": eid,
                        "answer": a,
                        "value": qv,
                    }
                )
        d = os.path.join(HERE, s)
        os.makedirs(d, exist_ok=True)
        for name, rows in (("library.jsonl", lib), ("queries.jsonl", qs)):
            with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print("written")


if __name__ == "__main__":
    main()
